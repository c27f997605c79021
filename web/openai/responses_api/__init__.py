"""OpenAI's Responses API: ``routes`` (the views and their event streams), ``request`` (a
validated body to a conversation and parameters) and ``render`` (the response object and its
numbered events), and ``store`` (the stored responses, one of the parts ``web.services``
holds)."""
