"""Ray Serve application, gateway, admin API, registry and pool stores, metrics, settings."""
