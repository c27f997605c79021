"""Trickle's worker: the Celery process (app, bootstep, dispatcher, runtime, publisher) and its
engine.

The job contract it shares with the web tier lives in ``trickle``; nothing in ``web`` imports this
package.
"""
