from django.urls import include, path
from django.views.generic import TemplateView

from .web import views

urlpatterns = [
    path("", TemplateView.as_view(template_name="index.html"), name="index"),
    # Browser pages (templates/, static/).
    path("speech/", views.speech_page, name="speech-page"),
    path("video/", views.video_page, name="video-page"),
    # Operations: liveness/readiness, Prometheus scrape, short-lived WebSocket tokens.
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics_view, name="metrics"),
    path("v1/ws-token", views.ws_token, name="ws-token"),
    # OpenAI-compatible HTTP audio APIs (omniweb/openai_api/).
    path("", include("omniweb.openai_api.urls")),
]
