from django.urls import path

from .consumers import VideoStreamConsumer

websocket_urlpatterns = [path("v1/video/chat/stream", VideoStreamConsumer.as_asgi())]
