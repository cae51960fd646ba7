"""`blockdraft chat` and the command line's conveniences: prompts from stdin, threads, devices, help, and the
checks that run before any model is loaded."""

from __future__ import annotations

import io
import socket

import pytest
import torch

import blockdraft.commands.generate as generate_command
from blockdraft.cli import build_parser, main
from blockdraft.commands.chat import ChatSession
from blockdraft.decode.decoder import Decoder

from tiny_models import char_tokenizer, tiny_draft, tiny_target


@pytest.fixture
def session():
    target = tiny_target("llama")
    target.tokenizer = char_tokenizer()
    return ChatSession(Decoder(target, tiny_draft(target, block_size=4)), max_new_tokens=6, system="Be brief.")


def test_a_chat_keeps_its_turns_and_its_commands(session):
    out = io.StringIO()
    reply = session.answer("hi", out)
    assert reply is not None and [m["role"] for m in session.messages] == ["user", "assistant"]
    assert session.conversation("again")[0] == {"role": "system", "content": "Be brief."}, "the system message leads"
    session.answer("again", out)
    assert len(session.messages) == 4, "each answer extends the conversation"
    session.command("/bogus", out)
    assert "unknown command /bogus" in out.getvalue() and len(session.messages) == 4, "a bad command changes nothing"
    session.command("/system Answer in one word.", out)
    assert session.system == "Answer in one word." and session.messages == [], "a new system message resets"
    session.answer("hi", out)
    session.command("/reset", out)
    assert session.messages == [] and session.command("/quit", out) == "quit"


def test_ctrl_c_stops_an_answer_not_the_session(session, monkeypatch):
    real = Decoder.stream

    def interrupted(self, *args, **kwargs):
        events = real(self, *args, **kwargs)
        yield next(events)
        raise KeyboardInterrupt

    monkeypatch.setattr(Decoder, "stream", interrupted)
    out = io.StringIO()
    assert session.answer("hi", out) is None and "stopped" in out.getvalue()
    assert session.messages == [], "a stopped answer is left out of the conversation"
    monkeypatch.undo()
    lines = iter(["hi", "/reset", "hi"])

    def read(prompt):
        return next(lines) if lines else ""

    def ended(prompt):
        try:
            return read(prompt)
        except StopIteration:
            raise EOFError from None

    assert session.loop(ended, out) == 0 and len(session.messages) == 2, "the session goes on after the stop"


def test_a_context_overflow_in_chat_is_a_message_not_a_crash(session):
    out = io.StringIO()
    assert session.answer("x" * 10_000, out) is None and "error:" in out.getvalue() and "/reset" in out.getvalue()


def test_chat_runs_from_the_command_line(model_folders, capsys, monkeypatch):
    target, draft = model_folders
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n/help\n"))
    code = main(["chat", "--target", target, "--draft", draft, "--dtype", "float32", "--max-new-tokens", "5"])
    out = capsys.readouterr().out
    assert code == 0 and "you> " in out and "/reset" in out


def test_generate_reads_piped_and_dash_prompts(model_folders, capsys, monkeypatch):
    target, draft = model_folders
    seen = []
    real = generate_command.encode
    monkeypatch.setattr(generate_command, "encode", lambda t, p, chat=True: (seen.append(p), real(t, p, chat))[1])
    common = ["generate", "--target", target, "--draft", draft, "--dtype", "float32", "--max-new-tokens", "3"]
    monkeypatch.setattr("sys.stdin", io.StringIO("from a pipe"))
    assert main(common) == 0 and seen[-1] == "from a pipe", "a piped prompt is read, not a built-in one"
    monkeypatch.setattr("sys.stdin", io.StringIO("from a dash"))
    assert main(common + ["-"]) == 0 and seen[-1] == "from a dash"
    assert main(common + ["hi", "--system", "Be brief."]) == 0
    assert seen[-1] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


@pytest.mark.parametrize("argv, words", [
    (["generate", "   "], "the prompt is empty"),
    (["generate", "hi", "--draft", "/no/such/draft"], "no such folder"),
    (["generate", "hi", "--target", "./no_such_folder"], "no such folder with a config.json"),
    (["generate", "hi", "--threads", "0"], "--threads"),
    (["chat", "--max-new-tokens", "0"], "max-new-tokens"),
])
def test_bad_input_is_one_line_before_any_model_load(argv, words, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    for module in ("blockdraft.commands.generate", "blockdraft.commands.chat"):
        monkeypatch.setattr(f"{module}.load_target", never)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_an_unreachable_hub_id_fails_at_once(capsys, monkeypatch):
    import blockdraft.commands.common as common

    monkeypatch.setattr(common, "hub_reachable", lambda timeout=2.0: False)
    monkeypatch.setattr(common, "_hub_cached", lambda repo: False)
    assert main(["generate", "hi", "--target", "someone/some-model"]) == 2
    assert "cannot be reached" in capsys.readouterr().err


def test_serve_names_a_busy_port_before_loading(capsys):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert main(["serve", "--port", str(port), "--draft", "/no/such/draft"]) == 2
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "--port" in err, "the port is checked first, before the draft"


def test_threads_device_and_version(model_folders, capsys):
    target, draft = model_folders
    before = torch.get_num_threads()
    try:
        assert main(["generate", "hi", "--target", target, "--draft", draft, "--dtype", "float32",
                     "--max-new-tokens", "2", "--threads", "1"]) == 0
        out = capsys.readouterr().out
        assert torch.get_num_threads() == 1 and "(1 threads" in out, "the thread count is set and printed"
    finally:
        torch.set_num_threads(before)
    args = build_parser("generate").parse_args(["generate", "hi"])
    assert args.device == "auto" and args.threads >= 1
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("blockdraft ")


def test_every_option_has_a_help_line_with_its_default():
    import argparse

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name in commands:
        sub = build_parser(name)
        command = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        text = command.format_help()
        for action in command._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{name} {action.option_strings[0]} has no help line"
                shown = action.default is None or action.default is False or "default" in text
                assert shown, f"{name} {action.option_strings[0]} hides its default"
    assert "(default: 256)" in build_parser("generate")._subparsers._group_actions[0].choices["generate"].format_help()


def test_inspect_without_a_path_inspects_the_shipped_draft():
    args = build_parser("inspect").parse_args(["inspect"])
    assert args.checkpoint.name == "smollm2-135m-instruct"
