"""pytest-xdist starts its workers one after another, each start waiting for the new Python to
answer, so the last of many begins long after the first. Started from threads, they begin
together. Applied where xdist's NodeManager has the method this relies on; else xdist's own
order stays. With -v, xdist's `[gwN]` lines may come in any order."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor


def install() -> None:
    from xdist.workermanage import NodeManager

    if not callable(getattr(NodeManager, "setup_node", None)) or getattr(NodeManager.setup_nodes, "parallel", False):
        return

    def setup_nodes(self, putevent):
        self.config.hook.pytest_xdist_setupnodes(config=self.config, specs=self.specs)
        with ThreadPoolExecutor(max(1, len(self.specs))) as pool:
            return list(pool.map(lambda spec: self.setup_node(spec, putevent), self.specs))

    setup_nodes.parallel = True
    NodeManager.setup_nodes = setup_nodes
