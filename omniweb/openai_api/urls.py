"""Routes without a trailing slash: the SDK posts to ``/v1/audio/speech``, and Django's slash
redirect would turn a POST into a GET."""

from django.urls import include, path

from . import views

urlpatterns = [
    path("v1/audio/speech", views.speech, name="openai-speech"),
    path("v1/audio/transcriptions", views.transcriptions, name="openai-transcriptions"),
    path("v1/models", views.models, name="openai-models"),
    path("v1/models/<path:model_id>", views.model, name="openai-model"),
    # The Realtime API's HTTP routes (by name: this package's modules never import realtime/, which
    # imports them).
    path("", include("omniweb.openai_api.realtime.urls")),
]
