"""Every WebSocket route of the site; each app contributes its own list."""

from omniweb.openai_api.realtime.routing import websocket_urlpatterns as realtime_routes
from speech.routing import websocket_urlpatterns as speech_routes
from video.routing import websocket_urlpatterns as video_routes

websocket_urlpatterns = [*speech_routes, *video_routes, *realtime_routes]
