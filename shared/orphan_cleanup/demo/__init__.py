"""``orphan-cleanup demo``: the whole product on one machine, in under a minute.

A small platform provisions VMs on moto (a fake AWS) through the ledger client
and leaks some of them in each way real platforms do. The real pipeline then
runs a report cycle, a delete cycle and, once the margin has passed, one more
delete cycle. The demo checks that the verdicts came out as expected and that
only the orphans are gone (exit 0), or says what differed (exit 1).

Progress goes to stderr, the story and the tables to stdout.

- ``story``: the narrative, the three cycles and the self-check;
- ``platform``: the platform that provisions through the ledger, and leaks;
- ``world``: Postgres, moto, and the settings and AWS session that point at them.

The library never imports this package; the CLI does, for ``demo`` only, and hands it
its way of printing (``Terminal``): the demo never imports the CLI.
"""

from orphan_cleanup.demo.story import Terminal, run_demo

__all__ = ["Terminal", "run_demo"]
