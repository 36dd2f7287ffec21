"""The engine. It never imports a lane module and never names a provider."""
