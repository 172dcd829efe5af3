"""The call graph of a GraphDef's function library: which functions the graph calls
(directly or not), which run inside loops, and the check that the library neither recurses
nor nests calls too deeply.

Part of :mod:`amp_rewrite.graph.io` (which re-exports these names).  Reads GraphDef
messages only.
"""

from __future__ import annotations

from typing import Any, Collection

from ..errors import InvalidGraphError


def called_functions(node_defs: Any, library: set[str]) -> set[str]:
    """The functions of ``library`` (names) that ``node_defs`` call: as their op, or through a
    function attribute (``If``'s branches, ``While``'s body, a call's ``f``).  Pure."""
    called: set[str] = set()
    if not library:
        return called
    for nd in node_defs:
        if nd.op in library:
            called.add(nd.op)
        attr_map = nd.attr
        for key in attr_map:  # by key: the map's values() view is slow pure Python
            value = attr_map[key]
            kind = value.WhichOneof("value")
            if kind == "func" and value.func.name in library:
                called.add(value.func.name)
            elif kind == "list":
                called.update(f.name for f in value.list.func if f.name in library)
    return called


def _calls_closure(graph_def: Any, start: set[str]) -> set[str]:
    """``start`` and every library function those call, directly or not.  Pure."""
    by_name = {f.signature.name: f for f in graph_def.library.function}
    names = set(by_name)
    todo = list(start)
    seen = set(todo)
    while todo:
        fdef = by_name[todo.pop()]
        for callee in called_functions(fdef.node_def, names) - seen:
            seen.add(callee)
            todo.append(callee)
    return seen


#: The longest chain of nested function calls accepted.  TensorFlow's own runtime and shape
#: inference walk call chains recursively in C++; real models nest a few levels (a Keras
#: layer's call inside a While body inside a signature), so this is far above any of them and
#: far below a stack overflow.
MAX_CALL_DEPTH = 256


def check_call_graph(graph_def: Any) -> None:
    """Raise :class:`InvalidGraphError` if the function library calls itself (a function
    calling itself, or functions calling each other in a cycle) or if a chain of nested calls
    is deeper than :data:`MAX_CALL_DEPTH`.

    TensorFlow has no recursion in graphs (a recursive call never terminates as dataflow),
    and its C++ shape inference and function instantiation overflow the stack on such
    libraries, killing the process.  Checked before anything hands the graph to TensorFlow.
    Iterative (Kahn's algorithm over the call graph); reads ``graph_def`` only.
    """
    fdefs = list(graph_def.library.function)
    if not fdefs:
        return
    names = {f.signature.name for f in fdefs}
    callees = {f.signature.name: called_functions(f.node_def, names) for f in fdefs}
    # Longest chain of calls below each function, computed from the callees up: a function is
    # done once everything it calls is.
    pending = {name: len(callees[name]) for name in names}
    called_by: dict[str, list[str]] = {name: [] for name in names}
    for name, called in callees.items():
        for callee in called:
            called_by[callee].append(name)
    depth = dict.fromkeys(names, 1)
    ready = [name for name, k in pending.items() if k == 0]
    done = 0
    while ready:
        name = ready.pop()
        done += 1
        for caller in called_by[name]:
            depth[caller] = max(depth[caller], depth[name] + 1)
            pending[caller] -= 1
            if pending[caller] == 0:
                ready.append(caller)
    if done < len(names):
        cyclic = sorted(name for name, k in pending.items() if k > 0)
        shown = ", ".join(repr(n) for n in cyclic[:3]) + (" ..." if len(cyclic) > 3 else "")
        raise InvalidGraphError(
            f"the function library is recursive ({len(cyclic)} function(s) call themselves, "
            f"directly or through others: {shown}); TensorFlow graphs cannot recurse")
    deepest = max(depth.values())
    if deepest > MAX_CALL_DEPTH:
        top = min((n for n in names if depth[n] == deepest))
        raise InvalidGraphError(
            f"function calls nest {deepest} deep (from {top!r}); at most {MAX_CALL_DEPTH} "
            "levels are accepted")


def reachable_functions(graph_def: Any) -> set[str]:
    """Names of library functions called, directly or through other functions, by the graph.

    Calls are ops named after a function and ``func`` / ``list(func)`` attributes (While
    bodies, If branches, PartitionedCall targets).  Grappler optimizes exactly these.
    """
    names = {f.signature.name for f in graph_def.library.function}
    return _calls_closure(graph_def, called_functions(graph_def.node, names))


def functions_named_outside(graph_def: Any, graphs: Collection[str]) -> set[str]:
    """The library functions that something besides ``graphs`` (names of functions whose IR
    the caller holds, and the main graph) refers to: called by a library function not among
    them, or named by the library's gradient table.  Their signatures are not the caller's to
    change.  Pure."""
    names = {f.signature.name for f in graph_def.library.function}
    named: set[str] = set()
    for fdef in graph_def.library.function:
        if fdef.signature.name not in graphs:
            named |= called_functions(fdef.node_def, names)
    for grad in graph_def.library.gradient:
        named.update((grad.function_name, grad.gradient_func))
    return named


#: Ops whose ``cond``/``body`` functions run once per iteration.
_LOOP_OPS = frozenset({"While", "StatelessWhile", "_While"})


def loop_functions(graph_def: Any) -> set[str]:
    """Names of the library functions that run inside a loop: the bodies and conditions of the
    While ops of the graph and of its functions, and every function those call.  Pure."""
    names = {f.signature.name for f in graph_def.library.function}
    loops = [nd for nd in graph_def.node if nd.op in _LOOP_OPS]
    for fdef in graph_def.library.function:
        loops.extend(nd for nd in fdef.node_def if nd.op in _LOOP_OPS)
    return _calls_closure(graph_def, called_functions(loops, names))
