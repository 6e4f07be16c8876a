from django.apps import AppConfig


class OmniwebConfig(AppConfig):
    name = "omniweb"
    verbose_name = "omniweb runtime"
