"""HTTP routes, one module per endpoint group (chat, models, health)."""
