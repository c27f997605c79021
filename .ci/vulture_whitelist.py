"""Definitions vulture cannot see used: a library calls them by name, or a string names them.

`make lint` fails on any other unused function, class, method or property (see Makefile).
"""

from tests import conftest
from tests.unit import test_chat_template_hf
from trickle.config.settings import _GivenEnvironment, _Layers
from web import gunicorn_conf
from web.common import chat_template
from worker import dispatch

_GivenEnvironment._load_env_vars  # noqa: B018  pydantic-settings calls it
_Layers.settings_customise_sources  # noqa: B018  pydantic-settings calls it
gunicorn_conf.post_worker_init  # noqa: B018  a gunicorn server hook, found by name
gunicorn_conf.pre_request  # noqa: B018  a gunicorn server hook, found by name
dispatch.generate_strategy  # noqa: B018  Celery's task strategy, named in worker.app
dispatch.TrickleConsumer  # noqa: B018  Celery's worker_consumer, named in worker.app
conftest.pytest_addoption  # noqa: B018  a pytest hook, found by name
conftest.pytest_configure  # noqa: B018  a pytest hook, found by name
chat_template.GenerationBlock._body  # noqa: B018  Jinja calls it (call_method names it)
test_chat_template_hf.AssistantTracker._generation_support  # noqa: B018  the same, for the test
