"""The parent's side of code_tests' verdict: a test is split, before anything runs, into what the
test process runs and what the parent evaluates itself; the child reports plain values only.

`plan_test` parses one test string into steps for the child and checks for the parent:

- top-level `assert <expr>[, msg]`: the parent evaluates `<expr>` with a small evaluator over plain
  values (`evaluate`); the maximal sub-expressions it cannot evaluate (they use names the child
  binds, e.g. `add(1, 2)`) become "probes", the only part of the assert the child sees;
- other simple top-level statements (assignments, expressions, imports, helper defs without an
  assert) run in the child and earn nothing by themselves;
- `def test_*():` without parameters: its top-level body is inlined as above (a top-level call of
  it is then dropped);
- `for NAME in <iterable the parent can evaluate>:` over the forms above: unrolled (bounded), the
  loop variable substituted as a literal.

Anything else holding an `assert`, a test without one, or a probe that itself compares values
(a comparison the child would make, fooled by a custom `__eq__`) is a bad row: ValueError.

`encode`/`decode` are the tagged JSON plain values the child reports: exact types only (int,
float as its repr, bool, str, bytes, None, complex, list/tuple/set/frozenset/dict of those).
"""

from __future__ import annotations

import ast
import builtins
import math

FORMS = ("`assert <expr>[, msg]`, simple statements (assignments, expressions, imports), "
         "`def test_*():` functions without parameters and `for NAME in <literal or range(...)>:` "
         "loops over these")
MAX_UNROLL = 1000  # asserts + statements a test may unroll to
MAX_DEPTH = 20  # nesting of a reported value
MAX_ITEMS = 100_000  # elements of all reported values of one test
MAX_INT_BITS = 1 << 16  # of an int the parent computes with
MAX_SEQ = 1_000_000  # length of a sequence the parent builds
MAX_SAME_HASH = 64  # distinct elements of one set or dict the parent builds that share a hash

# Functions the parent applies to plain values itself (a name bound by the row rebinds it).
FUNCTIONS = {name: getattr(builtins, name) for name in (
    "abs", "len", "round", "min", "max", "sum", "sorted", "set", "frozenset", "list", "tuple", "dict",
    "int", "float", "str", "bool", "all", "any", "range", "isinstance", "reversed", "complex", "bytes",
    "divmod", "pow", "chr", "ord", "repr", "type")}
MATH = {name: getattr(math, name) for name in (
    "isclose", "sqrt", "floor", "ceil", "fabs", "inf", "nan", "pi", "e", "isnan", "isinf", "isfinite",
    "log", "exp", "gcd", "factorial", "comb", "perm", "prod", "fsum")}
TYPES = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "tuple": tuple,
         "dict": dict, "set": set, "frozenset": frozenset, "bytes": bytes, "complex": complex}
KEYWORDS = {"isclose": {"rel_tol", "abs_tol"}, "sorted": {"reverse"}, "round": set(), "int": {"base"}}


class Unsupported(Exception):
    """The parent cannot evaluate this node: it becomes (part of) a probe."""


class NotPlain(Exception):
    """A reported value is not a plain value (or is malformed)."""


class ProbeFailed(Exception):
    """A probe's evaluation raised in the child; args[0] is the (sanitised) exception name."""


# ---- parsing a test ----------------------------------------------------------------------------------
def bound_names(source: str) -> set[str]:
    """Names a piece of source (the row's setup) binds at the top level or anywhere."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return names


def setup_constants(tree: ast.Module, known: set[str] = frozenset()) -> dict:
    """`NAME = <value the parent computes>` at the top level of the row's setup, NAME bound only
    there: the parent keeps these values (the response runs in the setup's namespace and could
    rebind NAME, or forge what it reports). A mutable value the setup's own code uses is left out."""
    fns = {name: MATH[name] for name in known if name in MATH}
    once, shared, bound = _once_bound(tree), _escaping(tree), bound_names(ast.unparse(tree))
    env: dict = {}
    for node in tree.body:
        bind_constant(node, env, fns, bound - set(env), once - set(known), shared)
    return env


def bind_constant(node: ast.stmt, env: dict, fns: dict, child: set[str], once: set[str], shared: set[str]) -> None:
    """Keep `NAME = <value the parent computes>` in `env` when NAME is in `once` (bound only
    there) and its value cannot change in the child (immutable, or NAME not in `shared`: never
    handed to the child's code)."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value = node.targets[0], node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None and node.simple:
        target, value = node.target, node.value
    else:
        return
    if not isinstance(target, ast.Name) or target.id not in once:
        return
    if _uses(value, child, {**fns, **env}) or not _supported(value, fns):
        return
    try:
        v = evaluate(value, {**fns, **env}, child)
        literal(v)
    except Exception:  # it fails in the child as well, or is no plain value: the child's
        return
    if _immutable(v) or target.id not in shared:
        env[target.id] = v


def plan_test(source: str, i: int, child_names: set[str], known: set[str] = frozenset(),
              constants: dict | None = None) -> tuple[list, list]:
    """(steps for the child, checks for the parent). A child step is [0, statement source, line] or
    [1, [probe source, ...], line]; checks[k] is (expression with probes as names "<p0>", ...,
    line) for the k-th step of kind 1. `child_names`: names bound outside the test (setup, entry);
    `known`: names the setup imported from math (the parent has them too); `constants`: the
    setup's (setup_constants)."""
    try:
        tree = ast.parse(source, f"<test {i}>")
    except SyntaxError as e:
        raise ValueError(f"tests[{i}] is not valid Python: {e.msg} (line {e.lineno})") from None
    except (ValueError, RecursionError, MemoryError) as e:
        raise ValueError(f"tests[{i}] cannot be parsed: {type(e).__name__}") from None
    if not tree.body:
        raise ValueError(f"tests[{i}] has no statements")
    mine = whitelisted_imports(tree)
    planner = _Planner(i, (child_names | bound_names(source)) - mine - (known - child_names),
                       (known | mine) - {"math"})
    planner.constants = _once_bound(tree) - child_names - mine
    planner.shared = _escaping(tree)
    rebound = bound_names(source)
    planner.block(tree.body, {k: v for k, v in (constants or {}).items()
                              if k not in rebound and (_immutable(v) or k not in planner.shared)})
    if not planner.checks:
        raise ValueError(f"tests[{i}] has no assert: nothing would decide whether it passes "
                         f"(supported forms: {FORMS})")
    return planner.steps, planner.checks


def whitelisted_imports(tree: ast.Module) -> set[str]:
    """`import math` / `from math import isclose` at the top level: the parent knows these."""
    known = set()
    for node in tree.body:
        if isinstance(node, ast.Import) and all(a.name == "math" and a.asname in (None, "math") for a in node.names):
            known.add("math")
        elif isinstance(node, ast.ImportFrom) and node.module == "math" and not node.level:
            known |= {a.name for a in node.names if a.name in MATH and a.asname in (None, a.name)}
    return known


class _Planner:
    def __init__(self, i: int, child_names: set[str], known: set[str]):
        self.i, self.child = i, child_names
        self.fns = {name: MATH[name] for name in known if name in MATH}
        self.steps: list = []
        self.checks: list = []
        self.inlined: set[str] = set()
        self.looping = 0
        # Names the test binds once from a value the parent computes (`expected = [1, 2]`): the
        # parent keeps that value, so a response that forges the report cannot claim it too.
        self.constants: set[str] = set()
        self.shared: set[str] = set()  # names the test's own code could mutate in the child

    def bad(self, node: ast.AST, what: str) -> ValueError:
        return ValueError(f"tests[{self.i}] line {getattr(node, 'lineno', '?')}: {what} is not supported "
                          f"(supported forms: {FORMS})")

    def emit(self, step: list) -> None:
        if len(self.steps) >= MAX_UNROLL:
            raise ValueError(f"tests[{self.i}] unrolls to more than {MAX_UNROLL} statements")
        self.steps.append(step)

    def block(self, body: list[ast.stmt], env: dict) -> None:
        for node in body:
            if isinstance(node, ast.Assert):
                self.assertion(node, env)
            elif isinstance(node, ast.FunctionDef) and node.name.startswith("test") and not self.looping:
                if node.decorator_list or _has_params(node.args):
                    raise self.bad(node, f"test function {node.name}() with parameters or decorators")
                self.inlined.add(node.name)
                self.block(node.body, env)
            elif isinstance(node, ast.For) and not node.orelse:
                self.loop(node, env)
            elif _is_call_of(node, self.inlined):
                continue  # `test_x()` after its definition: already inlined
            elif any(isinstance(n, ast.Assert) for n in ast.walk(node)):
                raise self.bad(node, f"an assert inside {type(node).__name__.lower()}")
            elif isinstance(node, (ast.Return, ast.Yield, ast.Break, ast.Continue)):
                raise self.bad(node, type(node).__name__.lower())
            else:
                compare = _direct_compare(node, self.child, {**self.fns, **env})
                if compare is not None:
                    raise self.bad(node, "a comparison outside an assert, made by the test process "
                                         f"({ast.unparse(compare)[:80]!r}; compare in the assert itself)")
                self.emit([0, ast.unparse(_Methods(COMPARING).visit(_substitute(node, env))), node.lineno])
                self.constant(node, env)

    def constant(self, node: ast.stmt, env: dict) -> None:
        bind_constant(node, env, self.fns, self.child, self.constants, self.shared)

    def loop(self, node: ast.For, env: dict) -> None:
        names = _target_names(node.target)
        if names is None:
            raise self.bad(node, "a for loop whose target is not a name or a tuple of names")
        try:
            values = list(evaluate(node.iter, {**self.fns, **env}, self.child))
        except Unsupported:
            raise self.bad(node, "a for loop over something only the test process can compute") from None
        except Exception as e:
            raise ValueError(f"tests[{self.i}] line {node.lineno}: the loop's iterable fails: "
                             f"{type(e).__name__}: {e}") from None
        if len(values) > MAX_UNROLL:
            raise ValueError(f"tests[{self.i}] line {node.lineno}: the loop has more than {MAX_UNROLL} items")
        for value in values:
            try:
                literal(value)  # what the test process is sent in place of the loop variable
            except ValueError:
                raise ValueError(f"tests[{self.i}] line {node.lineno}: the loop runs over "
                                 f"{type(value).__name__} values; only plain values are supported "
                                 f"(supported forms: {FORMS})") from None
        self.looping += 1
        for value in values:
            inner = dict(env)
            _bind(node.target, value, inner, self, node)
            self.block(node.body, inner)
        self.looping -= 1

    def assertion(self, node: ast.Assert, env: dict) -> None:
        probes: list[str] = []
        expr = self.split(node.test, env, probes)
        for n in ast.walk(expr):
            if isinstance(n, ast.Compare):
                sides = [n.left, *n.comparators]
                for k, op in enumerate(n.ops):
                    if isinstance(op, (ast.Is, ast.IsNot)) and not (_singleton(sides[k]) or _singleton(sides[k + 1])):
                        raise self.bad(node, "`is` between values (the parent sees copies: "
                                             "only `is None`, `is True`, `is False` or classes)")
        self.emit([1, probes, node.lineno])
        self.checks.append((expr, node.lineno, self.fns))

    def split(self, node: ast.expr, env: dict, probes: list[str]) -> ast.expr:
        """`node` with each maximal sub-expression the parent cannot evaluate replaced by a probe."""
        if not _uses(node, self.child, {**self.fns, **env}) and _supported(node, self.fns):
            return _substitute(node, env)
        if _structural(node, self.child, self.fns):
            new = _copy_with(node, lambda child: self.split(child, env, probes))
            if new is not None:
                return new
        if any(isinstance(n, ast.Compare) for n in ast.walk(node)):
            raise self.bad(node, "a comparison inside an expression only the test process can "
                                 f"evaluate ({ast.unparse(node)[:80]!r})")
        probes.append(ast.unparse(_Methods().visit(_substitute(node, env))))
        return ast.Name(f"<p{len(probes) - 1}>", ast.Load())


def _once_bound(tree: ast.Module) -> set[str]:
    """Names bound exactly once in the test, and not as a parameter, global or import anywhere."""
    counts: dict[str, int] = {}
    for n in ast.walk(tree):
        names = []
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            names = [n.id]
        elif isinstance(n, ast.arg):
            names = [n.arg, n.arg]
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [n.name]
        elif isinstance(n, ast.alias):
            names = [(n.asname or n.name).split(".")[0]] * 2
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            names = list(n.names) * 2
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names = [n.name, n.name]
        elif isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
            names = [n.name, n.name]
        elif isinstance(n, ast.MatchMapping) and n.rest:
            names = [n.rest, n.rest]
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    return {name for name, c in counts.items() if c == 1}


def _escaping(tree: ast.Module) -> set[str]:
    """Names the test's code could mutate in the child: used outside an assert (but as a for
    loop's iterable, which the parent evaluates), or inside an assert under a call of the child's
    code, an attribute, a lambda or a comprehension."""
    out: set[str] = set()

    def visit(node: ast.AST, exposed: bool) -> None:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and exposed:
            out.add(node.id)
        if isinstance(node, ast.Assert):
            exposed = False
        elif isinstance(node, ast.For):
            visit(node.iter, exposed and not isinstance(node.iter, ast.Name))
            for part in (node.target, *node.body, *node.orelse):
                visit(part, exposed)
            return
        elif isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS):
            exposed = True
        elif isinstance(node, (ast.Attribute, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                               ast.GeneratorExp, ast.NamedExpr)):
            exposed = True
        for child in ast.iter_child_nodes(node):
            visit(child, exposed)

    visit(tree, True)
    return out


def _immutable(v) -> bool:
    if type(v) in (tuple, frozenset):
        return all(_immutable(x) for x in v)
    return type(v) in (int, float, bool, str, bytes, complex, type(None))


def _direct_compare(node: ast.stmt, child: set[str], env: dict) -> ast.Compare | None:
    """A comparison in a test statement (not in a function, lambda or comprehension it defines)
    over values of the test process: `ok = add(1, 2) == 3` then `assert ok` would let a custom
    `__eq__` decide. Those nested bodies run in the test process too (see docs/security.md)."""
    todo = [node]
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Compare) and _uses(n, child, env):
            return n
        todo.extend(c for c in ast.iter_child_nodes(n) if not isinstance(c, (
            ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
            ast.DictComp, ast.GeneratorExp)))
    return None


def _singleton(node: ast.expr) -> bool:
    """An operand whose identity the parent can judge: None, True, False, a class."""
    return (isinstance(node, ast.Constant) and (node.value is None or type(node.value) is bool)
            or isinstance(node, ast.Name) and node.id in TYPES
            or isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type")


def _has_params(a: ast.arguments) -> bool:
    return bool(a.posonlyargs or a.args or a.vararg or a.kwonlyargs or a.kwarg)


def _is_call_of(node: ast.stmt, names: set[str]) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and not node.value.args
            and not node.value.keywords and isinstance(node.value.func, ast.Name) and node.value.func.id in names)


def _target_names(target: ast.expr) -> list[str] | None:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
        return [e.id for e in target.elts]
    return None


def _bind(target: ast.expr, value, env: dict, planner: _Planner, node: ast.AST) -> None:
    if isinstance(target, ast.Name):
        env[target.id] = value
        return
    try:
        items = list(value)
    except TypeError:
        items = None
    if items is None or len(items) != len(target.elts):
        raise ValueError(f"tests[{planner.i}] line {node.lineno}: cannot unpack {value!r} into "
                         f"{ast.unparse(target)}")
    for t, v in zip(target.elts, items):
        env[t.id] = v


def _uses(node: ast.AST, child: set[str], env: dict) -> bool:
    """Whether `node` refers to a name only the child has (not a loop variable, not whitelisted)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and not n.id.startswith("<p"):
            if n.id in env:
                continue
            if n.id in child or (n.id not in FUNCTIONS and n.id not in TYPES and n.id != "math"):
                return True
    return False


def _supported(node: ast.AST, fns: dict) -> bool:
    try:
        _check_shape(node, fns)
        return True
    except Unsupported:
        return False


_SHAPES = (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.UnaryOp, ast.BinOp, ast.BoolOp,
           ast.Compare, ast.Subscript, ast.Slice, ast.IfExp, ast.Call, ast.Name, ast.Attribute, ast.Load,
           ast.keyword, ast.expr_context, ast.operator, ast.unaryop, ast.boolop, ast.cmpop)


def _check_shape(node: ast.AST, fns: dict) -> None:
    for n in ast.walk(node):
        if not isinstance(n, _SHAPES):
            raise Unsupported(type(n).__name__)
        if isinstance(n, ast.Attribute) and not (isinstance(n.value, ast.Name) and n.value.id == "math"
                                                 and n.attr in MATH):
            raise Unsupported("attribute")
        if isinstance(n, ast.Call) and not _known_callee(n.func, fns):
            raise Unsupported("call")
        if isinstance(n, (ast.List, ast.Tuple, ast.Set)) and any(isinstance(e, ast.Starred) for e in n.elts):
            raise Unsupported("starred")


def _known_callee(func: ast.expr, fns: dict) -> bool:
    if isinstance(func, ast.Name):
        return func.id in FUNCTIONS or func.id in fns
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "math"


def _structural(node: ast.AST, child: set[str], fns: dict) -> bool:
    """Nodes whose parts can be split (the parent combines its parts' values)."""
    if isinstance(node, ast.Call):
        return (_known_callee(node.func, fns) and not (isinstance(node.func, ast.Name) and node.func.id in child)
                and not any(isinstance(a, ast.Starred) for a in node.args)
                and all(k.arg is not None for k in node.keywords))
    return isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.UnaryOp, ast.BinOp, ast.BoolOp,
                             ast.Compare, ast.Subscript, ast.IfExp))


def _copy_with(node: ast.expr, part) -> ast.expr | None:
    if isinstance(node, ast.Call):
        return ast.Call(node.func, [part(a) for a in node.args],
                        [ast.keyword(k.arg, part(k.value)) for k in node.keywords])
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        if any(isinstance(e, ast.Starred) for e in node.elts):
            return None
        return type(node)([part(e) for e in node.elts], ast.Load()) if not isinstance(node, ast.Set) \
            else ast.Set([part(e) for e in node.elts])
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            return None
        return ast.Dict([part(k) for k in node.keys], [part(v) for v in node.values])
    if isinstance(node, ast.UnaryOp):
        return ast.UnaryOp(node.op, part(node.operand))
    if isinstance(node, ast.BinOp):
        return ast.BinOp(part(node.left), node.op, part(node.right))
    if isinstance(node, ast.BoolOp):
        return ast.BoolOp(node.op, [part(v) for v in node.values])
    if isinstance(node, ast.Compare):
        return ast.Compare(part(node.left), node.ops, [part(c) for c in node.comparators])
    if isinstance(node, ast.Subscript):
        s = node.slice
        if isinstance(s, ast.Slice):
            s = ast.Slice(*(part(x) if x is not None else None for x in (s.lower, s.upper, s.step)))
        else:
            s = part(s)
        return ast.Subscript(part(node.value), s, ast.Load())
    if isinstance(node, ast.IfExp):
        return ast.IfExp(part(node.test), part(node.body), part(node.orelse))
    return None


METHOD = "__coevo_method"  # the harness's function a probe's method calls go through
COMPARING = frozenset((
    "count", "index", "get", "issubset", "issuperset", "isdisjoint", "countOf", "indexOf", "contains",
    "eq", "ne", "lt", "le", "gt", "ge", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
    "__contains__"))


class _Methods(ast.NodeTransformer):
    """`r.m(a, k=b)` -> `__coevo_method(r, "m", a, k=b)`: the child then refuses a builtin
    container holding a custom object, or a custom argument to a builtin or module function
    (`[E()].count(3)`, `{3: 1}.get(E())`, `operator.eq(E(), 3)` would compare in the child, where
    a custom `__eq__` or `__hash__` decides). Methods of the response's own objects still run.
    In the test's own statements (`r = result.count(3)`), only `names` (the methods whose plain
    result comes from comparing): a list there may well hold the response's objects."""

    def __init__(self, names: frozenset | None = None):
        self.names = names

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if isinstance(node.func, ast.Attribute) and (self.names is None or node.func.attr in self.names):
            return ast.copy_location(ast.Call(ast.Name(METHOD, ast.Load()),
                                              [node.func.value, ast.Constant(node.func.attr), *node.args],
                                              node.keywords), node)
        return node


class _Sub(ast.NodeTransformer):
    def __init__(self, env: dict):
        self.env = env

    def visit_Name(self, node: ast.Name):
        if node.id in self.env and isinstance(node.ctx, ast.Load):
            return ast.copy_location(ast.parse(literal(self.env[node.id]), mode="eval").body, node)
        return node


def _substitute(node: ast.AST, env: dict) -> ast.AST:
    """`node` with the loop variables in `env` written as literals (what the child is sent)."""
    if not env:
        return node
    import copy

    return ast.fix_missing_locations(_Sub(env).visit(copy.deepcopy(node)))


def literal(v) -> str:
    """Python source for a plain value."""
    t = type(v)
    if t is float and not math.isfinite(v):
        return f"float({repr(v)!r})"
    if t is complex:
        return f"complex({literal(v.real)}, {literal(v.imag)})"
    if t in (int, float, bool, str, bytes, type(None)):
        return repr(v)
    if t is list:
        return "[" + ", ".join(map(literal, v)) + "]"
    if t is tuple:
        return "(" + "".join(literal(x) + ", " for x in v) + ")"
    if t in (set, frozenset):
        inner = "[" + ", ".join(map(literal, v)) + "]"
        return f"{t.__name__}({inner})"
    if t is dict:
        return "{" + ", ".join(f"{literal(k)}: {literal(x)}" for k, x in v.items()) + "}"
    raise ValueError(f"not a plain value: {t.__name__}")


# ---- the parent's evaluator --------------------------------------------------------------------------
def evaluate(node: ast.AST, env: dict, child: set[str] = frozenset()):
    """Evaluate `node` over plain values: `env` holds loop variables and probe results (a probe
    that raised is a ProbeFailed instance, raised only when its value is needed)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            v = env[node.id]
            if isinstance(v, ProbeFailed):
                raise v
            return v
        if node.id in child:
            raise Unsupported(node.id)
        if node.id in FUNCTIONS or node.id in TYPES:
            return FUNCTIONS.get(node.id) or TYPES[node.id]
        raise Unsupported(node.id)
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "math" and node.attr in MATH \
                and "math" not in child:
            return MATH[node.attr]
        raise Unsupported("attribute")
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        if any(isinstance(e, ast.Starred) for e in node.elts):
            raise Unsupported("starred")
        items = [evaluate(e, env, child) for e in node.elts]
        return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise Unsupported("**")
        return {evaluate(k, env, child): evaluate(v, env, child) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp):
        v = evaluate(node.operand, env, child)
        return {ast.Not: lambda x: not x, ast.USub: lambda x: -x, ast.UAdd: lambda x: +x,
                ast.Invert: lambda x: ~x}[type(node.op)](_plain_arg(v))
    if isinstance(node, ast.BinOp):
        return _binop(node.op, _plain_arg(evaluate(node.left, env, child)),
                      _plain_arg(evaluate(node.right, env, child)))
    if isinstance(node, ast.BoolOp):
        last = None
        for part in node.values:
            last = _plain_arg(evaluate(part, env, child))
            if isinstance(node.op, ast.And) and not last or isinstance(node.op, ast.Or) and last:
                return last
        return last
    if isinstance(node, ast.Compare):
        left = _plain_arg(evaluate(node.left, env, child))
        for op, right_node in zip(node.ops, node.comparators):
            right = _plain_arg(evaluate(right_node, env, child))
            if not _compare(op, left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Subscript):
        value = _plain_arg(evaluate(node.value, env, child))
        s = node.slice
        if isinstance(s, ast.Slice):
            key = slice(*(evaluate(x, env, child) if x is not None else None for x in (s.lower, s.upper, s.step)))
        else:
            key = evaluate(s, env, child)
        return value[key]
    if isinstance(node, ast.IfExp):
        return evaluate(node.body if evaluate(node.test, env, child) else node.orelse, env, child)
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id in child:
            raise Unsupported(node.func.id)
        fn = evaluate(node.func, env, child)
        if not callable(fn) or any(isinstance(a, ast.Starred) for a in node.args):
            raise Unsupported("call")
        name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        allowed = KEYWORDS.get(name, set())
        kwargs = {}
        for k in node.keywords:
            if k.arg not in allowed:
                raise Unsupported(f"keyword {k.arg}")
            kwargs[k.arg] = evaluate(k.value, env, child)
        args = [_plain_arg(evaluate(a, env, child)) for a in node.args]
        return _call(fn, name, args, kwargs)
    raise Unsupported(type(node).__name__)


_PLAIN = (int, float, bool, str, bytes, type(None), complex, list, tuple, set, frozenset, dict, range,
          type, slice)


def _plain_arg(v):
    if type(v) not in _PLAIN and not (callable(v) and (v in FUNCTIONS.values() or v in MATH.values())):
        raise TypeError(f"not a plain value: {type(v).__name__}")
    return v


def _call(fn, name: str, args: list, kwargs: dict):
    if name == "range" and all(type(a) is int for a in args) and len(range(*args)) > MAX_SEQ:
        raise OverflowError("a range that long is refused")
    if name in ("list", "tuple", "set", "frozenset", "sorted", "str", "bytes") and args:
        if type(args[0]) is int and abs(args[0]) > MAX_SEQ:
            raise OverflowError(f"{name}() of a number that large is refused")
    if name in ("pow",) and len(args) >= 2 and type(args[1]) is int and abs(args[1]) > 10_000 \
            and (len(args) < 3 or args[2] is None):
        raise OverflowError("exponent too large")
    if name in ("factorial", "comb", "perm") and any(type(a) is int and a > 10_000 for a in args):
        raise OverflowError(f"math.{name} argument too large")
    if name == "prod" and args and type(args[0]) in (list, tuple, set, frozenset) and sum(
            x.bit_length() for x in args[0] if type(x) is int) > MAX_INT_BITS:
        raise OverflowError("a product that large is refused")  # 45,000 32-bit ints: 11 s
    if name == "round" and len(args) == 2 and type(args[1]) is int and abs(args[1]) > 10_000:
        raise OverflowError("round() to that many digits is refused")
    if name in ("set", "frozenset", "dict") and args and type(args[0]) in (list, tuple, set, frozenset, dict):
        few_collisions(args[0] if name != "dict" or type(args[0]) is dict
                       else [p[0] for p in args[0] if type(p) in (list, tuple) and len(p) == 2])
    out = fn(*args, **kwargs)
    if name == "reversed":
        out = list(out)
    return out


def _binop(op: ast.operator, a, b):
    import operator as o

    if isinstance(op, ast.Pow) and type(b) is int and (abs(b) > 10_000 or (type(a) is int and a.bit_length() * abs(b) > MAX_INT_BITS)):
        raise OverflowError("power too large")
    if isinstance(op, ast.LShift) and type(b) is int and b > MAX_INT_BITS:
        raise OverflowError("shift too large")
    if isinstance(op, ast.Mult):
        for seq, n in ((a, b), (b, a)):
            if isinstance(seq, (str, bytes, list, tuple)) and type(n) is int and len(seq) * n > MAX_SEQ:
                raise OverflowError("repetition too large")
    fns = {ast.Add: o.add, ast.Sub: o.sub, ast.Mult: o.mul, ast.Div: o.truediv, ast.FloorDiv: o.floordiv,
           ast.Mod: o.mod, ast.Pow: o.pow, ast.LShift: o.lshift, ast.RShift: o.rshift, ast.BitOr: o.or_,
           ast.BitXor: o.xor, ast.BitAnd: o.and_}
    if type(op) not in fns or (isinstance(op, ast.Mod) and isinstance(a, (str, bytes))):
        raise Unsupported(type(op).__name__)  # `%` formatting of strings, @
    return fns[type(op)](a, b)


def _compare(op: ast.cmpop, a, b) -> bool:
    import operator as o

    if isinstance(op, ast.Is):  # reported values are copies: identity only of singletons and classes
        if a is None or b is None or type(a) is bool or type(b) is bool or (isinstance(a, type) and isinstance(b, type)):
            return a is b
        raise TypeError("identity of two values is not known to the parent")
    if isinstance(op, ast.IsNot):
        return not _compare(ast.Is(), a, b)
    fns = {ast.Eq: o.eq, ast.NotEq: o.ne, ast.Lt: o.lt, ast.LtE: o.le, ast.Gt: o.gt, ast.GtE: o.ge,
           ast.In: lambda x, y: x in y, ast.NotIn: lambda x, y: x not in y}
    return bool(fns[type(op)](a, b))


# ---- plain values on the wire ---------------------------------------------------------------------
def decode(tagged, budget: list[int] | None = None, depth: int = 0):
    """A plain value from its tagged JSON form; NotPlain for anything else (forged data too)."""
    budget = budget if budget is not None else [MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise NotPlain("too large or too deep")
    if type(tagged) is not list or not tagged or type(tagged[0]) is not str:
        raise NotPlain("malformed")
    tag, rest = tagged[0], tagged[1:]
    try:
        if tag == "n" and not rest:
            return None
        (x,) = rest if tag != "c" else (rest,)
        if tag == "i" and type(x) is str and len(x) <= MAX_INT_BITS // 4 + 3:
            return int(x, 16)
        if tag == "f" and type(x) is str and len(x) <= 40:
            return float(x)
        if tag == "c" and len(x) == 2 and all(type(p) is str and len(p) <= 40 for p in x):
            return complex(float(x[0]), float(x[1]))
        if tag == "b" and type(x) is bool:
            return x
        if tag == "s" and type(x) is str:
            return x
        if tag == "y" and type(x) is str:
            return bytes.fromhex(x)
        if tag in ("l", "t", "S", "F") and type(x) is list:
            items = [decode(e, budget, depth + 1) for e in x]
            if tag in ("S", "F"):
                few_collisions(items)
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        if tag == "d" and type(x) is list:
            pairs = []
            for pair in x:
                if type(pair) is not list or len(pair) != 2:
                    raise NotPlain("malformed dict")
                pairs.append((decode(pair[0], budget, depth + 1), decode(pair[1], budget, depth + 1)))
            few_collisions([k for k, _ in pairs])
            return dict(pairs)
    except (ValueError, TypeError, OverflowError):
        pass
    raise NotPlain("malformed")


def few_collisions(items) -> None:
    """OverflowError (NotPlain when decoding) when more than MAX_SAME_HASH distinct-or-not items
    share a hash: int, float and tuple hashes are predictable (k * (2**61 - 1) all hash to 0), and
    a set or dict of n colliding keys costs n**2 comparisons, tens of seconds of the parent's CPU
    for one 1 MB report. Equal items count too: a set the child reported has none."""
    seen: dict[int, int] = {}
    for item in items:
        h = hash(item)  # TypeError for an unhashable item, as building the set would raise
        seen[h] = seen.get(h, 0) + 1
        if seen[h] > MAX_SAME_HASH:
            raise OverflowError(f"more than {MAX_SAME_HASH} elements share a hash")


def exception_name(name) -> str:
    """A child's exception class name, kept only when it is a built-in exception's (a name the
    response chose could carry data out)."""
    if type(name) is str and name.isidentifier():
        obj = getattr(builtins, name, None)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            return name
    return "an exception of its own class"
