from django.urls import path

from .consumers import SpeechStreamConsumer

websocket_urlpatterns = [path("v1/audio/speech/stream", SpeechStreamConsumer.as_asgi())]
