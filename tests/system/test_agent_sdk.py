"""OpenAI's Agents SDK, unchanged, on the demo model that ``make up`` serves, with the shipped
limits (no ``max_output_tokens`` from the SDK: the server's default of 128 applies).

The SDK refuses an ``incomplete`` turn (``ModelBehaviorError``), so every run here completes only
because the demo model ends its answers. The demo bigram never writes a tool call by itself (it
sees one piece of context): one whole loop takes its call from the scripted tool model
(``tests.tool_model``), another forces it on the demo model itself (``tool_choice: required``,
held to the tool's schema by constrained decoding); the demo model writes the final answer.
Every tool here is the SDK's default ``@function_tool``, strict; without a tool_choice it is auto.
The forced loop also runs on SmolLM2 under `make test-real-model` (``served_model``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import requests
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    RunResult,
    RunResultStreaming,
    function_tool,
    set_tracing_disabled,
)

from tests.faultstack import FaultStack, build_fault_stack

pytestmark = pytest.mark.timeout(180)

QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def agent_stack(
    tmp_path_factory: pytest.TempPathFactory,
    demo_model_dir: Path,
    tool_model: Path,
    served_model: str,
    served_model_table: str,
    served_worker_timeout: float,
) -> Iterator[FaultStack]:
    stack = build_fault_stack(
        tmp_path_factory.mktemp("agent-stack"),
        models_toml=(
            f'[models.demo]\npath = "{demo_model_dir}"\n'
            f'[models.tools]\npath = "{tool_model}"\nmax_batch_size = 4\n{served_model_table}'
        ),
        settings_toml="",  # configs/default.toml's limits, as on `make up`
    )
    models = tuple(dict.fromkeys(("demo", "tools", served_model)))
    stack.start_worker("agents", models, timeout=served_worker_timeout)
    set_tracing_disabled(True)
    yield stack
    stack.close()


class ToolModelFirst(OpenAIResponsesModel):
    """Sends the run's first turn to the tool model (it calls ``get_weather`` on cue) and every
    later one to the demo model."""

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        self.model = "tools" if self.model == "tools-first" else "demo"
        return await super().get_response(*args, **kwargs)


def weather_tool(cities: list[str]) -> Any:
    # The SDK's default: a strict tool. Under ``auto`` (no tool_choice, and after a forced
    # call) a call the model opens is held to its schema; text stays text.
    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return "sunny, 22C"

    return get_weather


def stored_statuses(stack: FaultStack, result: RunResult | RunResultStreaming) -> list[str]:
    """The status the server stored for each of the run's responses."""
    return [
        requests.get(f"{stack.web_url}/v1/responses/{raw.response_id}", timeout=10).json()["status"]
        for raw in result.raw_responses
    ]


def run_agent(stack: FaultStack, build: Any, inputs: list[Any], streamed: bool = False) -> Any:
    """Run ``build(client)``'s agent on each input, in one event loop; return the results."""

    async def run() -> list[RunResult | RunResultStreaming]:
        # Closed inside the loop: its pooled connections must not outlive the loop they use.
        async with openai.AsyncOpenAI(
            base_url=f"{stack.web_url}/v1", api_key="x", max_retries=0
        ) as client:
            agent = build(client)
            results: list[RunResult | RunResultStreaming] = []
            for item in inputs:
                if streamed:
                    running = Runner.run_streamed(agent, item)
                    async for _event in running.stream_events():
                        pass
                    results.append(running)
                else:
                    results.append(await Runner.run(agent, item))
            return results

    return asyncio.run(run())


# Sampled at the default temperature with a seed (repeatable: about 1 answer in 1,000 with
# tools offered runs past 128 tokens, see bench/demo_endings.py), and greedy.
SETTINGS = {
    "sampled": ModelSettings(extra_body={"seed": 7}),
    "greedy": ModelSettings(temperature=0),
}


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("mode", list(SETTINGS))
def test_an_agent_with_a_tool_completes_its_turns_on_the_demo_model(
    agent_stack: FaultStack, streamed: bool, mode: str
) -> None:
    def build(client: openai.AsyncOpenAI) -> Agent[Any]:
        return Agent(
            name="demo",
            instructions="Be brief.",
            tools=[weather_tool([])],
            model=OpenAIResponsesModel(model="demo", openai_client=client),
            model_settings=SETTINGS[mode],
        )

    results = run_agent(agent_stack, build, [QUESTION, "Tell me about sockets.", "Hi"], streamed)
    for result in results:
        assert isinstance(result.final_output, str) and result.final_output.strip()
        assert stored_statuses(agent_stack, result) == ["completed"] * len(result.raw_responses)


def test_a_whole_tool_loop_ends_with_the_demo_models_answer(agent_stack: FaultStack) -> None:
    cities: list[str] = []

    def build(client: openai.AsyncOpenAI) -> Agent[Any]:
        return Agent(
            name="weather",
            instructions="Be brief.",
            tools=[weather_tool(cities)],
            model=ToolModelFirst(model="tools-first", openai_client=client),
            model_settings=ModelSettings(temperature=0),
        )

    (result,) = run_agent(agent_stack, build, [QUESTION])
    assert cities == ["Paris"]  # the tool ran once, with the model's arguments
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert isinstance(result.final_output, str) and result.final_output.strip()
    assert stored_statuses(agent_stack, result) == ["completed", "completed"]
    answer = requests.get(
        f"{agent_stack.web_url}/v1/responses/{result.raw_responses[-1].response_id}", timeout=10
    ).json()
    assert answer["model"] == "demo" and answer["output"][0]["type"] == "message"


@pytest.mark.both_models
def test_a_forced_tool_call_runs_the_whole_loop_on_the_served_model(
    agent_stack: FaultStack, served_model: str
) -> None:
    """``make up``'s own models alone (demo, or SmolLM2 under `make test-real-model`): the SDK
    forces the first turn's call (parallel calls allowed, OpenAI's default), resets the choice
    after it (its default: the second turn sends no tool_choice), and the model answers from
    the tool's result. SmolLM2 ends its line after the call and then writes prose: the answer
    ends there with one call (it wrote the same call until max_output_tokens when that newline
    committed it to another, worker/engine/constrained.py)."""
    cities: list[str] = []

    def build(client: openai.AsyncOpenAI) -> Agent[Any]:
        return Agent(
            name="weather",
            instructions="Be brief.",
            tools=[weather_tool(cities)],
            model=OpenAIResponsesModel(model=served_model, openai_client=client),
            model_settings=ModelSettings(tool_choice="required", temperature=0),
        )

    (result,) = run_agent(agent_stack, build, [QUESTION])
    assert len(cities) == 1 and isinstance(cities[0], str)  # arguments that fit the schema
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert isinstance(result.final_output, str)
    assert stored_statuses(agent_stack, result) == ["completed", "completed"]


@pytest.mark.both_models
def test_the_plain_agent_completes_its_turns_on_the_served_model(
    agent_stack: FaultStack, served_model: str
) -> None:
    """The SDK's plain agent, nothing set (a strict tool under ``auto``, the model's own
    sampling and answer length: ``[models.smollm2.sampling]``), on ``make up``'s default model.
    Before the model's defaults, SmolLM2 at the API's temperature 1 babbled and, greedy,
    repeated itself into the 128-token default, and the SDK refused the cut turn."""
    if served_model == "demo":
        pytest.skip("the demo's plain agent: test_an_agent_with_a_tool_completes_its_turns_...")

    def build(client: openai.AsyncOpenAI) -> Agent[Any]:
        return Agent(
            name="plain",
            instructions="Be brief.",
            tools=[weather_tool([])],
            model=OpenAIResponsesModel(model=served_model, openai_client=client),
        )

    for result in run_agent(agent_stack, build, [QUESTION, "Hi"]):
        assert isinstance(result.final_output, str) and result.final_output.strip()
        assert stored_statuses(agent_stack, result) == ["completed"] * len(result.raw_responses)
