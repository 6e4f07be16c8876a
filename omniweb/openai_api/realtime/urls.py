"""The Realtime API's HTTP routes and page (``/v1/realtime`` itself is a WebSocket: ``routing``), included by
``omniweb.openai_api.urls`` by name. The API's routes have no trailing slash: Django's slash
redirect would turn a POST into a GET."""

from django.urls import path

from . import calls, client_secrets

urlpatterns = [
    path("v1/realtime/client_secrets", client_secrets.create_client_secret, name="realtime-client-secrets"),
    # The Realtime API over WebRTC (calls.py), and its browser page.
    path("v1/realtime/calls", calls.create_call, name="realtime-calls"),
    path("v1/realtime/calls/<str:call_id>/hangup", calls.hangup, name="realtime-call-hangup"),
    path("realtime/", calls.realtime_page, name="realtime-page"),
]
