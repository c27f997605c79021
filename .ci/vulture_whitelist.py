"""Definitions vulture cannot see used: a library calls them by name, or a string names them.

`make lint` fails on any other unused function, class, method or property (see Makefile).
"""

from trickle.config.settings import _GivenEnvironment, _Layers
from web import gunicorn_conf
from worker import dispatch

_GivenEnvironment._load_env_vars  # noqa: B018  pydantic-settings calls it
_Layers.settings_customise_sources  # noqa: B018  pydantic-settings calls it
gunicorn_conf.post_worker_init  # noqa: B018  a gunicorn server hook, found by name
gunicorn_conf.pre_request  # noqa: B018  a gunicorn server hook, found by name
dispatch.generate_strategy  # noqa: B018  Celery's task strategy, named in worker.app
dispatch.TrickleConsumer  # noqa: B018  Celery's worker_consumer, named in worker.app
