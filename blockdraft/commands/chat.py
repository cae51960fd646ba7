"""`blockdraft chat`: a multi-turn conversation on the target's chat template, each answer streamed as it decodes,
then one status line (tokens, tokens/s, tau). /reset, /system, /help, /quit; Ctrl-C stops an answer, Ctrl-D
leaves."""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from rich.console import Console

from ..api import load_draft
from ..decode.decoder import Decoder
from ..errors import BlockdraftError
from ..io.prompts import encode_prompt
from ..io.targets import load_target, parse_dtype
from ..metrics import AcceptanceStats
from ..textstream import TextStream
from .common import add_decode_arguments, add_model_arguments, prepare
from .decoding import decode_options, sampling_line

console = Console(stderr=True, highlight=False)

HELP = ("/reset forgets the conversation; /system TEXT sets the system message (and resets), /system alone shows "
        "it; /help shows this; /quit (or Ctrl-D) leaves. Ctrl-C stops an answer.")


def add_arguments(parser) -> None:
    parser.add_argument("--system", default=None, help="the system message the conversation starts with")
    add_decode_arguments(parser, what="answer")
    add_model_arguments(parser)


def run(args) -> int:
    options = decode_options(args, console)  # bad values fail here, before the model load
    prepare(args)
    with console.status("loading target and draft"):
        target = load_target(args.target, dtype=parse_dtype(args.dtype, args.device), device=args.device,
                             weights=args.weights)
        draft = load_draft(args.draft, target, full_vocab=args.full_vocab, ngrams=not args.no_ngrams)
    if not getattr(target.tokenizer, "chat_template", None):
        raise BlockdraftError(f"target {target.name} has no chat template; use `blockdraft generate` instead")
    decoder = Decoder(target, draft, options, measure_costs=args.measure_costs)
    with console.status("measuring step costs (once per machine)"):
        decoder.costs(1)
    console.print(f"[dim]chat with {target.name} ({options.describe()}, K={decoder.block_size()}, "
                  f"{args.threads} threads). {HELP}[/dim]")
    if not options.sampling.greedy:
        console.print(f"[dim]{sampling_line(options, drawn=args.seed is None)}[/dim]")
    session = ChatSession(decoder, args.max_new_tokens, args.system)
    return session.loop(input, sys.stdout)


class ChatSession:
    """One conversation: the messages so far, and the turns that extend them."""

    def __init__(self, decoder: Decoder, max_new_tokens: int, system: str | None = None) -> None:
        self.decoder, self.max_new_tokens = decoder, max_new_tokens
        self.system = system
        self.messages: list[dict] = []

    def loop(self, read: Callable[[str], str], out: TextIO) -> int:
        """Read a line, run a command or answer it, until end of input."""
        while True:
            try:
                line = read("you> ")
            except EOFError:
                out.write("\n")
                return 0
            except KeyboardInterrupt:  # at the prompt: a fresh line, the conversation stays
                out.write("\n(Ctrl-D or /quit leaves)\n")
                continue
            if line.strip().startswith("/"):
                if self.command(line.strip(), out) == "quit":
                    return 0
            elif line.strip():
                self.answer(line, out)

    def command(self, line: str, out: TextIO) -> str | None:
        name, _, rest = line.partition(" ")
        if name in ("/quit", "/exit"):
            return "quit"
        if name == "/reset":
            self.messages = []
            out.write("(conversation reset)\n")
        elif name == "/system":
            if rest.strip():
                self.system, self.messages = rest.strip(), []
                out.write("(system message set; conversation reset)\n")
            else:
                out.write(f"(system message: {self.system!r})\n")
        elif name == "/help":
            out.write(HELP + "\n")
        else:
            out.write(f"unknown command {name}; {HELP}\n")
        return None

    def conversation(self, user: str) -> list[dict]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + self.messages + [{"role": "user", "content": user}]

    def answer(self, user: str, out: TextIO) -> str | None:
        """Stream the answer to `user`; it joins the conversation once complete (a stopped one does not)."""
        target = self.decoder.target
        messages = self.conversation(user)
        stats = [AcceptanceStats(self.decoder.block_size())]
        text, tokens, pieces = TextStream(target.tokenizer), [], []
        start = time.perf_counter()
        try:
            ids = encode_prompt(target.tokenizer, messages)
            events = self.decoder.stream([ids], max_new_tokens=self.max_new_tokens, stats=stats)
            try:
                for event in events:
                    tokens += event.tokens
                    pieces.append(text.push(event.tokens))
                    out.write(pieces[-1])
                    out.flush()
            finally:
                events.close()
        except KeyboardInterrupt:
            out.write("\n(stopped; this answer is left out of the conversation)\n")
            return None
        except BlockdraftError as error:  # e.g. a conversation past the context: say so, keep the session
            out.write(f"error: {error}\n(/reset starts a new conversation)\n")
            return None
        pieces.append(text.flush())
        out.write(pieces[-1] + "\n")
        reply = "".join(pieces)
        self.messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        seconds = time.perf_counter() - start
        tau = f", tau {stats[0].mean_tau:.2f}" if self.decoder.speculative and stats[0].steps else ""
        console.print(f"[dim][{len(tokens)} tokens, {len(tokens) / seconds:.1f} tok/s{tau}][/dim]")
        return reply
