"""OpenAI's Responses API: ``routes`` (the views and their event streams), ``request`` (a
validated body to a conversation and parameters) and ``render`` (the response object and its
numbered events). The stored records live in ``web.openai.responses_api.store``, beside the other
stores the web process holds (``web.services``)."""
