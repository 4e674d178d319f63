"""ggml_cgraph: nodes and leafs in build order (``ggml_build_forward_expand``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from toolkit.errors import ToolkitError
from toolkit.ggml.tensor import Op, Tensor, TensorFlag

GGML_DEFAULT_GRAPH_SIZE = 2048


class GraphFull(ToolkitError):
    """More nodes (or leafs) than the graph's capacity (ggml asserts ``n_nodes < size``)."""


class Graph:
    """Nodes and leafs in ggml's build order.

    ``build_forward_expand(t)`` visits t's sources depth-first, left to right, sources
    before users; each tensor is visited once. A tensor with op NONE (and not a
    PARAM) is a leaf, everything else a node (views included). Unnamed tensors get
    ``leaf_<i>`` / ``node_<i>`` from their position, as ggml names them.

    >>> from toolkit.ggml import ops, F32
    >>> x = ops.new_tensor_1d(F32, 4, "x"); g = Graph(8); _ = g.build_forward_expand(ops.sqr(x))
    >>> [t.name for t in g.nodes], [t.name for t in g.leafs]
    (['node_0'], ['x'])
    """

    def __init__(self, size: int = GGML_DEFAULT_GRAPH_SIZE) -> None:
        if size <= 0:
            raise ValueError(f"graph size must be positive, got {size}")
        self.size = size
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self.visited: set[int] = set()
        self.use_counts: dict[int, int] = {}

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_leafs(self) -> int:
        return len(self.leafs)

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.nodes)

    def build_forward_expand(self, tensor: Tensor) -> int:
        """Add tensor and everything it depends on; returns the number of new nodes."""
        n0 = len(self.nodes)
        # iterative depth-first walk with ggml's order: srcs left to right, then the tensor
        stack: list[tuple[Tensor, int]] = [(tensor, 0)]
        if id(tensor) in self.visited:
            return 0
        self.visited.add(id(tensor))
        while stack:
            t, i = stack[-1]
            src = t.src
            while i < len(src) and src[i] is None:
                i += 1
            if i < len(src):
                s = src[i]
                assert s is not None
                stack[-1] = (t, i + 1)
                self.use_counts[id(s)] = self.use_counts.get(id(s), 0) + 1
                if id(s) not in self.visited:
                    self.visited.add(id(s))
                    stack.append((s, 0))
                continue
            stack.pop()
            self._add(t)
        return len(self.nodes) - n0

    def _add(self, t: Tensor) -> None:
        if t.op is Op.NONE and not (t.flags & TensorFlag.PARAM):
            if len(self.leafs) >= self.size:
                raise GraphFull(
                    f"graph capacity {self.size} exceeded by leaf {t.name or '#' + str(len(self.leafs))}"
                    f" (n_leafs would be {len(self.leafs) + 1})"
                )
            if not t.name:
                t.name = f"leaf_{len(self.leafs)}"
            self.leafs.append(t)
        else:
            if len(self.nodes) >= self.size:
                raise GraphFull(
                    f"graph capacity {self.size} exceeded by node {t.name or '#' + str(len(self.nodes))}"
                    f" (n_nodes would be {len(self.nodes) + 1})"
                )
            if not t.name:
                t.name = f"node_{len(self.nodes)}"
            self.nodes.append(t)

    def copy(self, size: int, shared: Callable[[Tensor], bool], rebind: Callable[[Tensor], Tensor] | None = None,
             srcs: Sequence[Sequence[Tensor | None]] | None = None) -> tuple[Graph, Callable[[Tensor], Tensor]]:
        """A graph of new tensors with the same fields and the same structure, holding up to ``size``
        nodes and leafs; tensors for which ``shared(t)`` is true (allocated ones: weights, the KV
        cache) are not copied, but kept (or replaced by ``rebind(t)``: another model's tensor of the
        same name). Returns the graph and a function from an old tensor to its copy (which
        copies, once, a tensor outside the graph too). ``srcs``: each node's sources to copy instead of
        its current ones (a graph that a split has rewritten, copied as it was built).

        Building the same graph again gives the same result; a copy is cheaper, and the scheduler may
        redirect the copy's sources without touching this graph.
        """
        if self.n_nodes > size or self.n_leafs > size:
            raise GraphFull(f"graph capacity {size} is smaller than the graph's {self.n_nodes} nodes "
                            f"and {self.n_leafs} leafs")
        # a bound method, not a closure that calls itself: such a closure is a reference cycle that would
        # keep every copied tensor alive until the cyclic collector ran (see toolkit.ggml.bulk)
        copier = _Copier(shared, rebind)
        memo, get = copier.memo, copier.get

        g = Graph(size)
        g.leafs = [get(t) for t in self.leafs]
        # nodes come after their sources: the sources are found in memo (get's own lookup, inlined)
        mget = memo.get
        nodes = g.nodes
        for k, t in enumerate(self.nodes):
            c = mget(id(t))
            if c is None:
                if shared(t):
                    c = t if rebind is None else rebind(t)
                else:
                    vs = t.view_src
                    c = t.duplicate([None if s is None else mget(id(s)) or get(s)
                                     for s in (t.src if srcs is None else srcs[k])],
                                    None if vs is None else mget(id(vs)) or get(vs))
                memo[id(t)] = c
            nodes.append(c)
        g.visited = {id(memo[i]) if i in memo else i for i in self.visited}
        g.use_counts = {id(memo[i]) if i in memo else i: n for i, n in self.use_counts.items()}
        return g, get

    def use_count(self, t: Tensor) -> int:
        return self.use_counts.get(id(t), 0)

    def to_text(self, leafs: bool = False) -> str:
        """One line per node: index, op, name, type and shape, then the sources."""
        lines = [f"graph: {self.n_nodes} nodes, {self.n_leafs} leafs (capacity {self.size})"]
        for i, t in enumerate(self.nodes):
            srcs = ", ".join(s.name for s in t.srcs)
            lines.append(
                f"node #{i:3d} ({t.op_desc():>10s}): {t.name:>20s} {t.type.lower:>4s} {t.shape_str():<20s} <- {srcs}"
            )
        if leafs:
            for i, t in enumerate(self.leafs):
                lines.append(f"leaf #{i:3d} ({'NONE':>10s}): {t.name:>20s} {t.type.lower:>4s} {t.shape_str()}")
        return "\n".join(lines)

    __str__ = to_text

    def __repr__(self) -> str:
        return f"Graph(n_nodes={self.n_nodes}, n_leafs={self.n_leafs}, size={self.size})"


def build_graph(outputs: Iterable[Tensor], size: int = GGML_DEFAULT_GRAPH_SIZE) -> Graph:
    g = Graph(size)
    for t in outputs:
        g.build_forward_expand(t)
    return g


class _Copier:
    """:meth:`Graph.copy`'s memo: each old tensor's copy, made once (``shared`` ones kept or rebound)."""

    __slots__ = ("memo", "shared", "rebind")

    def __init__(self, shared: Callable[[Tensor], bool], rebind: Callable[[Tensor], Tensor] | None) -> None:
        self.memo: dict[int, Tensor] = {}
        self.shared, self.rebind = shared, rebind

    def get(self, t: Tensor) -> Tensor:
        memo = self.memo
        c = memo.get(id(t))
        if c is not None:
            return c
        if self.shared(t):
            c = t if self.rebind is None else self.rebind(t)
            memo[id(t)] = c
            return c
        # a tensor reached through a source or view base but not in the graph (or not yet)
        vs = t.view_src
        get = self.get
        c = t.duplicate([None if s is None else get(s) for s in t.src], None if vs is None else get(vs))
        memo[id(t)] = c
        return c
