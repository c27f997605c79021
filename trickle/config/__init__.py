"""Configuration: the settings model, loaded once at start-up and passed down."""
