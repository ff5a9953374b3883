"""Choice decoding: an answer schema's text as forced stretches and a few choice points.

Under the default prompt variant the JSON schema (messages.answer_schema) fixes all but ~8 of the
~45 tokens of an answer: the model really chooses only the hit-rate trend, much/little,
replace/keep, the budget and two directions. llama.cpp's grammar still samples every token one
at a time. Here the schema is compiled (`template`) into a small character automaton of its
canonical JSON text (json.dumps spacing); `ChoiceDecoder` then evaluates each forced stretch as
one batch and samples greedily only where the automaton branches, among the vocabulary tokens
that keep the text inside it (a walk of the vocabulary's character trie, cached per state).

A schema with free text (a negated class, an unbounded repeat, anything else not compiled here)
has no template: `template` returns None and callers keep the grammar path.
"""
from __future__ import annotations

import json
import threading
import time
import numpy as np

# -- a regular language of the answer's text -------------------------------------------------
# AST: ("lit", str) | ("cls", frozenset) | ("seq", [n]) | ("alt", [n]) | ("rep", n, lo, hi)

_UNSAFE = set('"\\') | {chr(c) for c in range(32)}  # JSON would escape them: not in a template
_MAX_REPEAT = 8  # bounded repeats are unrolled; longer ones are free text: grammar path


class Unsupported(ValueError):
    """The schema has a part a choice template cannot express (free text)."""


def _parse_pattern(pat: str):
    """The regex subset answer_schema's patterns use: literals, escapes, (…|…), ?, {m,n},
    [a-z0-9] classes. Anything else raises Unsupported."""
    if pat.startswith("^"):
        pat = pat[1:]
    if pat.endswith("$") and not pat.endswith("\\$"):
        pat = pat[:-1]
    pos = 0

    def alt():
        nonlocal pos
        branches = [seq()]
        while pos < len(pat) and pat[pos] == "|":
            pos += 1
            branches.append(seq())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def seq():
        nonlocal pos
        items = []
        while pos < len(pat) and pat[pos] not in "|)":
            items.append(quantified(atom()))
        return ("seq", items)

    def atom():
        nonlocal pos
        c = pat[pos]
        pos += 1
        if c == "(":
            if pat.startswith("?:", pos):
                pos += 2
            node = alt()
            if pos >= len(pat) or pat[pos] != ")":
                raise Unsupported(f"unbalanced group in {pat!r}")
            pos += 1
            return node
        if c == "[":
            end = pat.index("]", pos)
            body, pos = pat[pos:end], end + 1
            if body.startswith("^") or "\\" in body:
                raise Unsupported(f"class [{body}] is free text")
            chars, i = set(), 0
            while i < len(body):
                if i + 2 < len(body) and body[i + 1] == "-":
                    chars |= {chr(x) for x in range(ord(body[i]), ord(body[i + 2]) + 1)}
                    i += 3
                else:
                    chars.add(body[i])
                    i += 1
            return ("cls", frozenset(chars))
        if c == "\\":
            c = pat[pos]
            pos += 1
            if c.isalnum():
                raise Unsupported(f"escape \\{c}")
            return ("lit", c)
        if c in ".*+{}?^$":
            raise Unsupported(f"{c!r} in {pat!r}")
        return ("lit", c)

    def quantified(node):
        nonlocal pos
        while pos < len(pat) and pat[pos] in "?{*+":
            c = pat[pos]
            if c in "*+":
                raise Unsupported("unbounded repeat")
            if c == "?":
                pos += 1
                node = ("rep", node, 0, 1)
                continue
            end = pat.index("}", pos)
            lo, _, hi = pat[pos + 1:end].partition(",")
            lo_n, hi_n = int(lo), int(hi) if hi else int(lo)
            if hi_n > _MAX_REPEAT:
                raise Unsupported(f"repeat {{{lo},{hi}}} is free text")
            pos = end + 1
            node = ("rep", node, lo_n, hi_n)
        return node

    node = alt()
    if pos != len(pat):
        raise Unsupported(f"cannot parse {pat!r} at {pos}")
    return node


def _chars(node) -> set[str]:
    kind = node[0]
    if kind == "lit":
        return set(node[1])
    if kind == "cls":
        return set(node[1])
    if kind in ("seq", "alt"):
        return set().union(*(_chars(n) for n in node[1])) if node[1] else set()
    return _chars(node[1])


def _value(schema: dict):
    """AST of one JSON value under `schema`, in json.dumps form (", " and ": ")."""
    if "anyOf" in schema:
        return ("alt", [_value(s) for s in schema["anyOf"]])
    if "const" in schema:
        return ("lit", json.dumps(schema["const"]))
    if "enum" in schema:
        return ("alt", [("lit", json.dumps(v)) for v in schema["enum"]])
    kind = schema.get("type")
    if kind == "boolean":
        return ("alt", [("lit", "true"), ("lit", "false")])
    if kind == "string" and "pattern" in schema:
        inner = _parse_pattern(schema["pattern"])
        if _chars(inner) & _UNSAFE:
            raise Unsupported("pattern allows characters JSON escapes")
        return ("seq", [("lit", '"'), inner, ("lit", '"')])
    if kind == "object":
        props = schema.get("properties", {})
        if set(schema.get("required", [])) != set(props) or schema.get("additionalProperties", True):
            raise Unsupported("an object with optional or extra keys")
        items: list = [("lit", "{")]
        for i, (key, sub) in enumerate(props.items()):
            items.append(("lit", (", " if i else "") + json.dumps(key) + ": "))
            items.append(_value(sub))
        items.append(("lit", "}"))
        return ("seq", items)
    raise Unsupported(f"schema part {schema!r}")


class Template:
    """The answer's text as a lazily determinised automaton over characters. States are ints;
    `step(s, ch)` is the next state or None; `out(s)` the characters that continue from s."""

    def __init__(self, ast):
        # Thompson NFA: per state, char transitions (set, next) and epsilon edges
        self._edges: list[list[tuple[frozenset, int]]] = []
        self._eps: list[list[int]] = []
        start, self._final = self._build(ast)
        self._sets: list[frozenset] = []
        self._ids: dict[frozenset, int] = {}
        self._step: dict[tuple[int, str], int | None] = {}
        self._out: dict[int, str] = {}
        self._lock = threading.Lock()  # templates are shared: two models may walk one at once
        self.start = self._dstate(self._closure({start}))

    def _new(self) -> int:
        self._edges.append([])
        self._eps.append([])
        return len(self._edges) - 1

    def _build(self, node) -> tuple[int, int]:
        kind = node[0]
        a = self._new()
        if kind == "lit":
            cur = a
            for ch in node[1]:
                nxt = self._new()
                self._edges[cur].append((frozenset(ch), nxt))
                cur = nxt
            return a, cur
        if kind == "cls":
            b = self._new()
            self._edges[a].append((node[1], b))
            return a, b
        if kind == "seq":
            cur = a
            for n in node[1]:
                s, e = self._build(n)
                self._eps[cur].append(s)
                cur = e
            return a, cur
        if kind == "alt":
            b = self._new()
            for n in node[1]:
                s, e = self._build(n)
                self._eps[a].append(s)
                self._eps[e].append(b)
            return a, b
        _, sub, lo, hi = node  # rep: lo copies, then hi - lo optional ones
        cur = a
        b = self._new()
        for i in range(hi):
            s, e = self._build(sub)
            self._eps[cur].append(s)
            if i >= lo:
                self._eps[cur].append(b)
            cur = e
        self._eps[cur].append(b)
        return a, b

    def _closure(self, states) -> frozenset:
        todo, seen = list(states), set(states)
        while todo:
            for n in self._eps[todo.pop()]:
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return frozenset(seen)

    def _dstate(self, nfa: frozenset) -> int:
        if nfa not in self._ids:
            self._ids[nfa] = len(self._sets)
            self._sets.append(nfa)
        return self._ids[nfa]

    def step(self, s: int, ch: str) -> int | None:
        key = (s, ch)
        if key not in self._step:
            with self._lock:
                nxt = {n for q in self._sets[s] for chars, n in self._edges[q] if ch in chars}
                self._step[key] = self._dstate(self._closure(nxt)) if nxt else None
        return self._step[key]

    def walk(self, s: int | None, text: str) -> int | None:
        for ch in text:
            if s is None:
                return None
            s = self.step(s, ch)
        return s

    def out(self, s: int) -> str:
        if s not in self._out:
            self._out[s] = "".join(sorted({c for q in self._sets[s] for chars, _ in self._edges[q]
                                           for c in chars}))
        return self._out[s]

    def accepts(self, s: int) -> bool:
        return self._final in self._sets[s]

    def forced(self, s: int) -> str:
        """The text that must follow state s before the next choice (or the end)."""
        text = []
        while not self.accepts(s) and len(self.out(s)) == 1:
            ch = self.out(s)
            text.append(ch)
            s = self.step(s, ch)
        return "".join(text)

    def matches(self, text: str) -> bool:
        s = self.walk(self.start, text)
        return s is not None and self.accepts(s)

    def sample(self, rng) -> str:
        """A random text of the language (tests: the template and the schema accept the same)."""
        s, text = self.start, []
        while True:
            out = self.out(s)
            if self.accepts(s) and (not out or rng.random() < 0.5):
                return "".join(text)
            ch = out[rng.integers(len(out))]
            text.append(ch)
            s = self.step(s, ch)


_TEMPLATES: dict[str, Template | None] = {}
_TEMPLATES_LOCK = threading.Lock()


def template(schema: dict) -> Template | None:
    """The choice template of an answer schema, or None (free text: keep the grammar path).
    Cached per schema (the automaton and its token sets fill in as decoding visits states)."""
    key = json.dumps(schema, sort_keys=True)
    with _TEMPLATES_LOCK:
        if key not in _TEMPLATES:
            try:
                _TEMPLATES[key] = Template(_value(schema))
            except Unsupported:
                _TEMPLATES[key] = None
        return _TEMPLATES[key]


# -- the decoder -----------------------------------------------------------------------------

class _Vocab:
    """The model's plain-text tokens (printable ASCII, what a template's text is made of) as a
    character trie: node = [children dict, token ids]."""

    def __init__(self, llm):
        self.root: list = [{}, []]
        self.text: dict[int, str] = {}
        self._allowed: dict[tuple[int, int], tuple[np.ndarray, list[int]]] = {}
        for tok in range(llm.n_vocab()):
            if llm._model.token_get_attr(tok) & 0b1011:  # unknown, unused, control
                continue
            try:
                t = llm.detokenize([tok]).decode("ascii")
            except UnicodeDecodeError:
                continue
            if not t or not t.isprintable():
                continue
            self.text[tok] = t
            node = self.root
            for ch in t:
                node = node[0].setdefault(ch, [{}, []])
            node[1].append(tok)

    def allowed(self, tpl: Template, s: int) -> tuple[np.ndarray, list[int]]:
        """Tokens whose whole text keeps the answer inside the template from state s, and the
        state after each (cached per template and state: templates live as long as the process)."""
        key = (id(tpl), s)
        if key not in self._allowed:
            ids, nexts = [], []
            stack = [(self.root, s)]
            while stack:
                node, st = stack.pop()
                for ch, child in node[0].items():
                    nxt = tpl.step(st, ch)
                    if nxt is None:
                        continue
                    for tok in child[1]:
                        ids.append(tok)
                        nexts.append(nxt)
                    stack.append((child, nxt))
            self._allowed[key] = (np.array(ids, dtype=np.int64), nexts)
        return self._allowed[key]


def _commit_point(forced: str, final: bool) -> int:
    """How much of a forced stretch to read before the next choice: all of it, less a word the
    choice continues and the space before it: BPE glues a space to the word after it, so the
    model picks " off" as it would without a template, not "ff" after "lookahead o"."""
    if final:
        return len(forced)
    i = len(forced)
    while i and forced[i - 1].isalnum():
        i -= 1
    return len(forced[:i].rstrip(" "))


class ChoiceDecoder:
    """Greedy decoding of a template's choices with a llama_cpp.Llama (one call at a time: the
    caller holds the model's lock). The prompt's longest prefix already in the model's KV cache
    is kept, as llama_cpp's own generate() does."""

    def __init__(self, llm):
        from llama_cpp import llama_chat_format

        self.llm = llm
        self._vocab: _Vocab | None = None
        meta_tpl = llm.metadata.get("tokenizer.chat_template")
        if llm.chat_format != "chat_template.default" or not meta_tpl:
            raise Unsupported(f"chat format {llm.chat_format!r}: only the model's own template")
        eos, bos = llm.token_eos(), llm.token_bos()
        self.formatter = llama_chat_format.Jinja2ChatFormatter(
            template=meta_tpl, eos_token=llm._model.token_get_text(eos) if eos != -1 else "",
            bos_token=llm._model.token_get_text(bos) if bos != -1 else "", stop_token_ids=[eos])

    @property
    def vocab(self) -> _Vocab:
        if self._vocab is None:  # ~1 s for Qwen's 152k tokens: once per model
            self._vocab = _Vocab(self.llm)
        return self._vocab

    def prompt_tokens(self, messages: list[dict]) -> list[int]:
        res = self.formatter(messages=messages)
        return self.llm.tokenize(res.prompt.encode("utf-8"), add_bos=not res.added_special, special=True)

    def logits(self) -> np.ndarray:
        """The next token's logits after the last `read` (a view into llama.cpp's buffer)."""
        llm = self.llm
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))

    def read(self, tokens: list[int]) -> int:
        """Evaluates the prompt, reusing the KV cache's common prefix; returns tokens read."""
        llm = self.llm
        n = min(llm.n_tokens, len(tokens) - 1)  # at least one token read: its logits are needed
        held = np.asarray(llm.input_ids[:n])
        diff = np.flatnonzero(held != np.asarray(tokens[:n], dtype=held.dtype))
        keep = int(diff[0]) if diff.size else n
        llm.n_tokens = keep  # Llama.eval drops the KV cache from n_tokens on
        llm.eval(tokens[keep:])
        return len(tokens) - keep

    def complete(self, messages: list[dict], tpl: Template, max_tokens: int = 160,
                 deadline: float | None = None, cancel: threading.Event | None = None,
                 tokens: list[int] | None = None) -> tuple[str, str, dict]:
        """(text, finish_reason, stats). finish_reason "stop" when the template's text is
        complete, else "length" / "timeout" / "cancelled" (text then cut short)."""
        t0 = time.monotonic()
        tokens = self.prompt_tokens(messages) if tokens is None else tokens
        read = self.read(tokens)
        t_read = time.monotonic() - t0
        vocab, llm = self.vocab, self.llm
        s, out, n_gen, choices = tpl.start, [], 0, 0
        pending: list[int] = []  # the chosen token and the forced text after it: one batch
        finish = "stop"
        while True:
            forced = tpl.forced(s)
            end = tpl.walk(s, forced)
            if tpl.accepts(end) and not tpl.out(end):  # the rest is forced: nothing to read
                out.append(forced)
                n_gen += len(llm.tokenize(forced.encode(), add_bos=False, special=False)) if forced else 0
                break
            chunk = forced[:_commit_point(forced, False)]
            if chunk:
                pending += llm.tokenize(chunk.encode(), add_bos=False, special=False)
                s = tpl.walk(s, chunk)
                out.append(chunk)
            if cancel is not None and cancel.is_set():
                finish = "cancelled"
                break
            if deadline is not None and time.monotonic() > deadline:
                finish = "timeout"
                break
            if pending:
                llm.eval(pending)
                n_gen += len(pending)
                pending = []
            if n_gen >= max_tokens:
                finish = "length"
                break
            ids, nexts = vocab.allowed(tpl, s)
            if not len(ids):  # cannot happen for a template built from printable text
                finish = "no-token"
                break
            k = int(np.argmax(self.logits()[ids]))
            tok = int(ids[k])
            out.append(vocab.text[tok])
            s = nexts[k]
            pending = [tok]
            choices += 1
        stats = {"prompt_tokens": len(tokens), "read_tokens": read, "read_s": t_read,
                 "generated_tokens": n_gen, "choices": choices, "total_s": time.monotonic() - t0}
        return "".join(out), finish, stats
