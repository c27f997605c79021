"""Function calling: tool definitions and choices (``definitions``), the per-model parsers that
find tool calls in a model's text (``parser``, ``hermes``, ``json_calls``), and their events
gathered into an answer (``calls``). Pure logic: the routes feed them a job's text."""
