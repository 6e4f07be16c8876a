"""Every WebSocket route of the site; each app contributes its own list."""

from speech.routing import websocket_urlpatterns as speech_routes
from video.routing import websocket_urlpatterns as video_routes

websocket_urlpatterns = [*speech_routes, *video_routes]
