"""The OpenAI-compatible endpoints, laid out as vLLM's ``entrypoints/openai``: ``routes`` (the
views), ``requests`` (a validated body to generation parameters), ``responses`` (completion
objects and stream chunks), and ``responses_api`` (OpenAI's Responses API, the same split).

Every choice of every request is a Trickle job; the request bodies' pydantic models live in
``web.common.request_models`` beside the job API's, so one OpenAPI document is generated from them
all.
"""
