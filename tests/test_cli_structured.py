"""The command line's structured output: --json-schema / --regex / --choice / --grammar / --json-object, refused in
one line with exit 2 before the model loads when the file, the constraint or the combination is bad; on the real
model the output matches, --json carries the Result's "structured" object, and running out of --max-tokens says so."""

from __future__ import annotations

import io
import json
import re

import jsonschema
import pytest

from minitransformer.cli import main
from structured_cases import CHOICES, REGEXES, SCHEMAS


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if the model is loaded: these refusals must come first."""
    import minitransformer.core.loading

    monkeypatch.setattr(minitransformer.core.loading, "load_model", lambda *a, **k: pytest.fail("model was loaded"))


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1, captured.err
    return lines[0]


@pytest.mark.parametrize("options,message", [
    (["--regex", "[a-"], "--regex: invalid regex"),
    (["--json-schema", "/nonexistent/schema.json"], "--json-schema: cannot read /nonexistent/schema.json"),
    (["--json-schema", "{tmp}/bad.json"], "--json-schema: invalid JSON schema"),
    (["--json-schema", "{tmp}/notjson.json"], "--json-schema: the JSON schema is not valid JSON"),
    (["--grammar", "{tmp}/bad.lark"], "--grammar: invalid grammar"),
    (["--choice", "a,,b"], "--choice: choice must be a non-empty list of non-empty strings"),
])
def test_a_bad_constraint_is_one_line_exit_2_before_loading(options, message, tmp_path, no_model, capsys):
    (tmp_path / "bad.json").write_text('{"type": "nope"}')
    (tmp_path / "notjson.json").write_text("{type: object")
    (tmp_path / "bad.lark").write_text("start: undefined_rule\n")
    options = [o.replace("{tmp}", str(tmp_path)) for o in options]
    assert main(["generate", "hi", *options]) == 2
    assert message in one_error_line(capsys)


def test_two_constraints_are_a_usage_error(no_model, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "hi", "--regex", "a", "--choice", "a,b"])
    assert exit_.value.code == 2
    assert "--choice: not allowed with argument --regex" in one_error_line(capsys)


def test_chat_takes_its_constraint_from_a_file_not_stdin(no_model, capsys):
    assert main(["chat", "--json-schema", "-"]) == 2
    assert "give --json-schema / --grammar a path" in one_error_line(capsys)


def test_choices_split_on_commas_unless_repeated():
    from minitransformer.cli import build_parser
    from minitransformer.cli.options import structured_from_args

    parse = build_parser().parse_args
    assert structured_from_args(parse(["generate", "x", "--choice", "a,b,c"])).choice == ("a", "b", "c")
    assert structured_from_args(parse(["generate", "x", "--choice", "a, b", "--choice", "c"])).choice == ("a, b", "c")
    assert structured_from_args(parse(["generate", "x"])) is None


# ---------------------------------------------------------------------------------------------------- the real model

def test_json_schema_output_parses_validates_and_reports_its_masks(real_model_path, tmp_path, capsys):
    name, schema, prompt = SCHEMAS[0]
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    assert main(["generate", prompt, "--chat", "--max-tokens", "96", "--json-schema", str(tmp_path / "schema.json"),
                 "--json", "--model", str(real_model_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(json.loads(out["text"]), schema)
    assert out["finish_reason"] == "stop"
    structured = out["structured"]
    assert structured["type"] == "json" and structured["complete"] is True
    assert structured["masks"] == len(out["token_ids"]) == len(structured["allowed_tokens"])
    assert 0 < structured["mask_s_per_token"] < 1


def test_json_schema_from_stdin_streams_and_the_footer_shows_the_mask(real_model_path, monkeypatch, capsys):
    name, schema, prompt = SCHEMAS[8]                                 # boolean and integer
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(schema)))
    assert main(["generate", prompt, "--chat", "--max-tokens", "96", "--json-schema", "-",
                 "--model", str(real_model_path)]) == 0
    captured = capsys.readouterr()
    jsonschema.validate(json.loads(captured.out), schema)
    assert re.search(r"finish stop \(structured\) \| json mask \d+\.\d\d ms/token\]", captured.err), captured.err


def test_regex_and_choice_hold(real_model_path, capsys):
    regex, prompt = REGEXES[0]
    assert main(["generate", prompt, "--max-tokens", "16", "--regex", regex, "--model", str(real_model_path)]) == 0
    assert re.fullmatch(regex, capsys.readouterr().out.removesuffix("\n"))
    choices, prompt = CHOICES[2]
    assert main(["generate", prompt, "--max-tokens", "8", "--choice", ",".join(choices),
                 "--model", str(real_model_path)]) == 0
    assert capsys.readouterr().out.removesuffix("\n") in choices
    assert main(["generate", "Would you like some tea? ", "--max-tokens", "8", "--choice", "yes, please",
                 "--choice", "no, thanks", "--model", str(real_model_path)]) == 0
    assert capsys.readouterr().out.removesuffix("\n") in ("yes, please", "no, thanks")


def test_running_out_of_max_tokens_says_the_output_will_not_parse(real_model_path, tmp_path, capsys):
    name, schema, prompt = SCHEMAS[0]
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    assert main(["generate", prompt, "--chat", "--max-tokens", "4", "--json-schema", str(tmp_path / "schema.json"),
                 "--json", "--model", str(real_model_path)]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)                                   # stdout stays one JSON object
    assert out["finish_reason"] == "length" and out["structured"]["complete"] is False
    warning = captured.err.strip().splitlines()[-1]
    assert warning == ("minitransformer: warning: the output stopped at --max-tokens (4 tokens) before the JSON "
                       "schema was complete, so it will not parse; raise --max-tokens")
