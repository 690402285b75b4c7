"""Structured-output rewards: JSON against a JSON Schema, and IoU of bounding boxes."""

from __future__ import annotations

import json
import math
import re

from actors.rewards import REWARD_FUNCTIONS
from actors.rewards.text import MAX_CHARS, MISSING, check_text, flag, refuse_longer, require, tagged


# ---- JSON Schema -----------------------------------------------------------------------------------
def last_json_fence(text: str) -> str | None:
    """Content of the last fenced code block labelled `json` (or unlabelled) in `text`; a block
    left open at the end of the text runs to the end. None when there is no such block."""
    found, lang, body = None, None, None
    for line in text.splitlines():
        stripped = line.strip()
        if body is None:
            m = re.fullmatch(r"```\s*([\w+\-]*)\s*", stripped)
            if m:
                lang, body = m.group(1).lower(), []
        elif stripped.startswith("```") and not stripped.strip("`"):
            if lang in ("", "json"):
                found = "\n".join(body)
            body = None
        else:
            body.append(line)
    if body is not None and lang in ("", "json"):
        found = "\n".join(body)
    return found


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


_VALIDATORS: dict[str, object] = {}


def _validator(schema):
    """A cached jsonschema validator for `schema` (a dict or a JSON string)."""
    import jsonschema

    if isinstance(schema, (bytes, bytearray)):
        schema = check_text(schema, "schema")
    if isinstance(schema, str):
        key = schema
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
    else:
        try:
            key = json.dumps(schema, sort_keys=True)
        except (TypeError, ValueError) as e:
            raise ValueError(f"the JSON schema must be a JSON object, got "
                             f"{type(schema).__name__}: {e}") from None
    if key in _VALIDATORS:
        return _VALIDATORS[key]
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"the JSON schema must be an object or a boolean, got {type(schema).__name__}")
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise ValueError(f"invalid JSON schema: {e.message}") from None
    if len(_VALIDATORS) >= 128:
        _VALIDATORS.clear()
    _VALIDATORS[key] = validator = cls(schema)
    return validator


@REWARD_FUNCTIONS.register("json_schema")
def json_schema(prompt: str, response: str, schema=MISSING, fence: bool = True,
                parse_credit: float = 0.0, extract_tag: str | None = None, max_chars: int | None = MAX_CHARS,
                **columns) -> float:
    """1 if the response is JSON that validates against a JSON Schema, else 0.

    The schema comes from `args.schema` or, when the recipe gives none, the row's `schema` column
    (a JSON object or its JSON text); an invalid schema raises ValueError. With `fence: true`
    (default) the content of the last ```json (or unlabelled) fenced block is used when there is
    one, else the whole response; with `fence: false` the whole response must be JSON. NaN and
    Infinity are not JSON here. JSON that parses but fails the schema scores `args.parse_credit`
    (default 0). `args.extract_tag` looks only inside the last `<tag>` block. Uses the `jsonschema`
    package (imported on first call; validators cached per schema). A response over
    `args.max_chars` characters (default 1,000,000) raises ValueError.

    YAML: `{name: json, fn: json_schema, args: {schema: {type: object, required: [name]}}}`
    """
    validator = _validator(require(schema, "schema", columns))
    text = tagged(refuse_longer(check_text(response), max_chars), extract_tag)
    if text is None:
        return 0.0
    if flag(fence, "fence"):
        text = last_json_fence(text) or text
    try:
        instance = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return 0.0
    return 1.0 if validator.is_valid(instance) else float(parse_credit)


# ---- IoU ---------------------------------------------------------------------------------------------
_NUM = r"\s*(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*"
_BOX = re.compile(rf"[\[(]{_NUM},{_NUM},{_NUM},{_NUM}[\])]")


def box_iou(a, b) -> float:
    """Intersection over union of two [x1, y1, x2, y2] boxes (continuous coordinates); a box with
    x2 <= x1 or y2 <= y1 has no area, so its IoU is 0."""
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def max_weight_matching(weights: list[list[float]]) -> list[tuple[int, int]]:
    """Row-column pairs maximising the summed weight (Hungarian algorithm / Kuhn-Munkres with
    potentials, O(n^2 m) for an n x m matrix, pure Python; rows or columns may be left over)."""
    n = len(weights)
    m = len(weights[0]) if n else 0
    if n == 0 or m == 0:
        return []
    flipped = n > m
    if flipped:
        weights = [list(col) for col in zip(*weights)]
        n, m = m, n
    inf = float("inf")
    u, v = [0.0] * (n + 1), [0.0] * (m + 1)
    owner, back = [0] * (m + 1), [0] * (m + 1)  # owner[j]: row matched to column j (1-based)
    for row in range(1, n + 1):
        owner[0], col = row, 0
        slack, used = [inf] * (m + 1), [False] * (m + 1)
        while owner[col] != 0:
            used[col] = True
            r, delta, nxt = owner[col], inf, 0
            cost = weights[r - 1]
            for j in range(1, m + 1):
                if not used[j]:
                    reduced = -cost[j - 1] - u[r] - v[j]
                    if reduced < slack[j]:
                        slack[j], back[j] = reduced, col
                    if slack[j] < delta:
                        delta, nxt = slack[j], j
            for j in range(m + 1):
                if used[j]:
                    u[owner[j]] += delta
                    v[j] -= delta
                else:
                    slack[j] -= delta
            col = nxt
        while col:
            prev = back[col]
            owner[col] = owner[prev]
            col = prev
    pairs = [(owner[j] - 1, j - 1) for j in range(1, m + 1) if owner[j]]
    return [(j, i) for i, j in pairs] if flipped else pairs


def greedy_matching(weights: list[list[float]]) -> list[tuple[int, int]]:
    """Pairs taken in order of decreasing weight, each row and column at most once."""
    order = sorted(((w, i, j) for i, row in enumerate(weights) for j, w in enumerate(row) if w > 0),
                   reverse=True)
    rows, cols, pairs = set(), set(), []
    for _, i, j in order:
        if i not in rows and j not in cols:
            rows.add(i)
            cols.add(j)
            pairs.append((i, j))
    return pairs


def _reference_boxes(value, name: str) -> list[list[float]]:
    if isinstance(value, (str, bytes, bytearray)):
        try:
            value = json.loads(check_text(value, name))
        except ValueError as e:
            raise ValueError(f"row's {name!r} is not a JSON list of boxes: {e}") from None
    if not isinstance(value, (list, tuple)):
        value = list(value) if hasattr(value, "__len__") else value  # numpy arrays
    if not isinstance(value, list | tuple):
        raise ValueError(f"row's {name!r} must be a list of [x1, y1, x2, y2] boxes, got {value!r}")
    if len(value) == 4 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        value = [value]  # one box
    boxes = []
    for box in value:
        box = list(box) if hasattr(box, "__len__") else box
        if (not isinstance(box, list) or len(box) != 4 or any(
                isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) for x in box)):
            raise ValueError(f"row's {name!r} holds {box!r}, not an [x1, y1, x2, y2] box")
        boxes.append([float(x) for x in box])
    return boxes


@REWARD_FUNCTIONS.register("iou")
def iou(prompt: str, response: str, boxes=MISSING, matching: str = "hungarian", max_boxes: int = 100,
        extract_tag: str | None = None, max_chars: int | None = MAX_CHARS, **columns) -> float:
    """Mean IoU between the boxes in the response and the reference boxes (Visual-RFT, Mixed-R1).

    Predicted boxes are every `[x1, y1, x2, y2]` (or `(x1, y1, x2, y2)`) of four numbers in the
    response (inside JSON too, e.g. `{"bbox_2d": [10, 20, 50, 80]}`); reference boxes come from the
    row's `boxes` column (one box, a list of boxes, or their JSON text). Boxes are paired one to
    one to maximise total IoU: `matching: hungarian` (default; exact, own pure-Python
    implementation, no scipy) or `matching: greedy` (highest IoU first). The score is the summed IoU
    of the pairs over max(#predicted, #reference): every unmatched box, on either side, counts
    0. No reference boxes and none predicted scores 1. Coordinates are continuous (no +1 pixel
    convention); a box with x2 <= x1 or y2 <= y1 has no area. `args.extract_tag` looks only inside the last
    `<tag>` block. More than `args.max_boxes` boxes on either side (default 100) or a response over
    `args.max_chars` characters (default 1,000,000) raises ValueError, bounding the work.

    YAML: `{name: iou, fn: iou, args: {matching: hungarian}}`
    """
    if matching not in ("hungarian", "greedy"):
        raise ValueError(f"args.matching must be 'hungarian' or 'greedy', got {matching!r}")
    gold = _reference_boxes(require(boxes, "boxes", columns), "boxes")
    limit = int(max_boxes)
    if len(gold) > limit:
        raise ValueError(f"row has {len(gold)} reference boxes, over max_boxes={limit}")
    text = tagged(refuse_longer(check_text(response), max_chars), extract_tag)
    pred = []
    for m in _BOX.finditer(text or ""):
        if len(pred) == limit:
            raise ValueError(f"response has more than max_boxes={limit} boxes")
        box = [float(x) for x in m.groups()]
        pred.append(box if all(map(math.isfinite, box)) else [0.0] * 4)  # 1e999: no area
    if not pred or not gold:
        return float(not pred and not gold)
    weights = [[box_iou(p, g) for g in gold] for p in pred]
    pairs = max_weight_matching(weights) if matching == "hungarian" else greedy_matching(weights)
    return sum(weights[i][j] for i, j in pairs) / max(len(pred), len(gold))
