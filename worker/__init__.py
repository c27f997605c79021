"""Trickle's worker: the Celery process (app, bootstep, dispatch, runtime, publisher), its engine.

The job contract it shares with the web tier lives in ``trickle``; nothing in ``web`` imports this
package.
"""
