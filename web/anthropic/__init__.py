"""Anthropic's Messages API on the same jobs as every other route, laid out as ``web.openai``:
``models`` (the request bodies and the answers' shapes), ``request`` (a validated body to a
prompt and generation parameters), ``conversation`` (messages and tools to the template's
turns), ``render`` (the message object and its stream events), ``tool_blocks`` (an answer read
for tool calls as content blocks), ``stream`` (what a stream writes per token), ``errors``
(every error of these routes in Anthropic's shape) and ``routes`` (the views).

A message is one Trickle job: ``msg_<hex>`` runs as ``job_<hex>``.
"""
