"""response_format: the output parses and matches the schema, whatever the model would say."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from python_backend.engine.sequence import EngineRequest
from python_backend.protocol.errors import ContractError
from python_backend.protocol.params import parse_parameters
from python_backend.sampling.structured import GrammarCompiler, GrammarSpec
from tests.fixtures.engine_driver import Collected, Driver

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}


def submit(driver: Driver, compiler: GrammarCompiler, content: str, **raw) -> Collected:
    params = parse_parameters(raw, stream=True)
    out = Collected()
    driver.engine.submit(
        EngineRequest(
            request_id=f"structured-{content}-{id(out)}",
            prompt_ids=driver.prompt_ids(content),
            params=params,
            sink=out.sink,
            grammar=compiler.compile(params.response_format) if params.response_format else None,
        )
    )
    return out


@pytest.fixture(scope="module")
def compiler(tiny_loaded) -> GrammarCompiler:
    return GrammarCompiler(tiny_loaded.tokenizer, tiny_loaded.vocab_size)


def test_json_schema_is_enforced_while_sampling(driver: Driver, compiler: GrammarCompiler) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}
    runs = [
        submit(driver, compiler, f"is it {i}?", response_format=fmt, temperature=1.0, seed=i, max_tokens=60)
        for i in range(4)
    ]
    plain = driver.submit("is it 0?", temperature=1.0, seed=0, max_tokens=60)
    for run in runs:
        run.wait()
        value = json.loads(run.text())
        assert set(value) == {"answer", "sure"}
        assert value["answer"] in ("yes", "no") and isinstance(value["sure"], bool)
        assert run.last().finish_reason == "stop"
    plain.wait()  # an unconstrained request in the same batch is untouched
    with pytest.raises(json.JSONDecodeError):
        json.loads(plain.text())


def test_json_object_output_is_json_so_far(driver: Driver, compiler: GrammarCompiler) -> None:
    run = submit(driver, compiler, "json please", response_format={"type": "json_object"}, temperature=0, max_tokens=12)
    text = run.wait().text()
    assert text.lstrip().startswith(("{", "["))


def test_unusable_schema_is_a_400(compiler: GrammarCompiler) -> None:
    with pytest.raises(ContractError) as caught:
        compiler.compile({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}})
    assert caught.value.info.param == "response_format"
    with pytest.raises(ContractError):
        compiler.compile({"type": "json_schema", "json_schema": {"name": "x"}})


def test_json_object_admits_only_an_object_at_the_top_level(compiler: GrammarCompiler) -> None:
    grammar = compiler.compile({"type": "json_object"})
    for text, admitted in (('{"a": [1, {"b": null}]}', True), ("[false]", False), ("false", False), ('"x"', False)):
        assert xgr.GrammarMatcher(grammar).accept_string(text) is admitted, text


def test_json_object_wins_over_a_bias_towards_an_array(driver: Driver, compiler: GrammarCompiler) -> None:
    bracket = driver.loaded.tokenizer.encode("[", add_special_tokens=False)[0]
    run = submit(
        driver,
        compiler,
        "json please",
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=12,
        logit_bias={str(bracket): 100},
    )
    assert run.wait().text().lstrip().startswith("{")


def test_compiled_grammars_are_cached_by_schema_and_bounded(tiny_loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    compiler = GrammarCompiler(tiny_loaded.tokenizer, tiny_loaded.vocab_size, cache_entries=2)
    compiled: list[str] = []
    real = GrammarCompiler._compile

    def counting(self: GrammarCompiler, spec: GrammarSpec) -> object:
        compiled.append(spec.schema)
        return real(self, spec)

    monkeypatch.setattr(GrammarCompiler, "_compile", counting)

    def fmt(name: str) -> dict:
        schema = {"type": "object", "properties": {name: {"type": "integer"}}}
        return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}

    first = compiler.compile(fmt("a"))
    assert compiler.compile(fmt("a")) is first and len(compiled) == 1  # the same schema: cached
    compiler.compile(fmt("b"))
    compiler.compile(fmt("c"))  # a third schema evicts the least recently used
    compiler.compile(fmt("a"))
    assert len(compiled) == 4
    compiler.close()


def test_a_schema_over_the_ceiling_is_a_400_without_compiling(tiny_loaded) -> None:
    compiler = GrammarCompiler(tiny_loaded.tokenizer, tiny_loaded.vocab_size, max_schema_bytes=100)
    enum = [f"value-{i}" for i in range(50)]
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": enum}}}
    with pytest.raises(ContractError) as caught:
        compiler.spec(fmt)
    assert caught.value.info.param == "response_format" and "100" in caught.value.info.message
