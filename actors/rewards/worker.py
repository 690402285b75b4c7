"""Child process that runs reward functions (started by actors.rewards.sandbox).

Protocol on its stdin/stdout: length-prefixed pickles. First message: {source: fn_name}. Then
each request is a list of (source, kwargs); for every item, in order, one reply
(value, error) goes back. User code that prints cannot corrupt the channel: fd 1 is moved to
stderr before any user code runs.
"""

from __future__ import annotations

import math
import numbers
import os
import pickle
import struct
import sys
import traceback


def read_frame(stream) -> object | None:
    head = stream.read(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack("<I", head)
    return pickle.loads(stream.read(size))


def write_frame(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def _call(fn, kwargs) -> tuple[float | None, str | None]:
    try:
        value = fn(**kwargs)
    except Exception as e:  # any user error becomes that sample's reward_error
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return None, f"{type(e).__name__}: {e} (at {os.path.basename(tb.filename)}:{tb.lineno})"
    if isinstance(value, bool):
        value = float(value)
    if not isinstance(value, numbers.Real) or not math.isfinite(value):  # numpy scalars too
        return None, f"returned {value!r}; a reward must be a finite number"
    return float(value), None


def main() -> None:
    proto_in = sys.stdin.buffer
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from actors.rewards import REWARD_FUNCTIONS

    specs = read_frame(proto_in)
    fns = {source: REWARD_FUNCTIONS.get(name) for source, name in specs.items()}
    write_frame(proto_out, "ready")
    while (request := read_frame(proto_in)) is not None:
        for source, kwargs in request:
            write_frame(proto_out, _call(fns[source], kwargs))


if __name__ == "__main__":
    main()
