from django.urls import path

from .consumer import RealtimeConsumer

websocket_urlpatterns = [path("v1/realtime", RealtimeConsumer.as_asgi())]
