"""The help texts of ``orphans``, ``events`` and ``report`` (what operators watch)."""

ORPHANS_EPILOG = """The orphans found and not deleted yet (open, deleting, delete_failed), across cycles, of every
backend or one: ref, region, primary id, resources, size as the listing read it (instance or
machine type, GPUs where the API gives them, disk GB, addresses), first and last seen, the last
action, the reason. With a backend's `prices` setting (the operator's own prices, never fetched:
README.md, "Open orphans and what they cost"), an estimated cost per hour and since first seen,
and a total per backend. Read-only: never changes the database (migrate first).

`orphans keep REF --backend ID` keeps a ref a cycle recorded: its groups are protected
(kept_by_operator), reported and never deleted, until released or until --for has passed (by the
database's clock), also in a delete cycle that already planned the delete (the deleter reads the
keep right before its provider calls). `orphans release REF --backend ID` ends a keep. Both write
the keep and an event (orphan_kept, orphan_released), nothing else.

examples:
  orphan-cleanup orphans
  orphan-cleanup orphans --backend aws-prod --json | jq 'map(.cost_so_far) | add'
  orphan-cleanup backend update aws-prod --settings '{"prices": {"instance_hour": {"m5.large": 0.096},
      "disk_gb_month": 0.08, "address_hour": 0.005}}'
  orphan-cleanup orphans keep k3j9x0q2m1ab --backend aws-prod --for 2d --reason "post-mortem of job 4711"
  orphan-cleanup orphans release k3j9x0q2m1ab --backend aws-prod"""
KEEP_EPILOG = """Keeps a ref's groups: protected (kept_by_operator), reported, never deleted, by scheduled and
manual cycles, and by a delete already planned (the deleter reads the keep right before its
provider calls; a call already sent cannot be recalled, and the command says when a delete of
the ref is in flight). The ref must be one a cycle of the backend recorded (orphans, explain).
Keeping a kept ref replaces its keep. Writes the keep and an orphan_kept event.

examples:
  orphan-cleanup orphans keep k3j9x0q2m1ab --backend aws-prod --reason "post-mortem of job 4711"
  orphan-cleanup orphans keep k3j9x0q2m1ab --backend aws-prod --for 2d    # until two days from now

exit codes: 0 kept, 2 bad input (unknown backend, a ref no cycle of it recorded, a bad --for)"""
RELEASE_EPILOG = """Ends a keep: from the next listing on, the ref's groups are judged as any other (an orphan is
deleted by a delete cycle). Writes an orphan_released event.

example:
  orphan-cleanup orphans release k3j9x0q2m1ab --backend aws-prod

exit codes: 0 released, 2 bad input (unknown backend, a ref that is not kept)"""
EVENTS_EPILOG = """The events table (README.md, "The events table"): one row per reported orphan or protected
group, deletion, failed delete, cycle failure and backend removal, oldest first. --since takes
a number and a unit (s, m, h, d). Read-only: never changes the database (migrate first).

examples:
  orphan-cleanup events --since 6h
  orphan-cleanup events --backend aws-prod --since 7d --json | jq 'map(select(.kind == "delete_failed"))'"""
REPORT_EPILOG = """What leaks cost and how fast they were cleaned over the period --since (default 30d) up to
now (README.md, "What leaks cost"). It counts the orphans (verdict orphan; protected groups are
never deleted, so not counted) whose life reaches into the period. An orphan's life runs from
when it became one (its owner's end: terminated or soft-deleted, the earlier; else the
creation the listing read) to its deletion, or now while it is open; rows recorded before
this version start at their first listing and end at their last.
  orphans found    first listed as an orphan in the period
  orphans deleted  deleted in the period
  orphans open     not deleted yet, now
  orphan-hours     the sum of each orphan's hours within the period
  cost             each orphan's cost per hour (its listed size at its backend's `prices`
                   setting) times those hours; null (-) without any price table
  time to detect   first listing - when it became an orphan (those found in the period)
  time to delete   deletion - when it became an orphan (those deleted in the period)
                   both as p50 and p90 (percentile_cont), in seconds
The table adds what each reason stands for. --html FILE also writes one self-contained page
(no network) with the same figures and a stacked-bar chart per day (UTC) and reason: the
orphans alive that day and the cost accrued that day. Read-only: never changes the database.

examples:
  orphan-cleanup report
  orphan-cleanup report --backend aws-prod --since 7d --json | jq .by_reason
  orphan-cleanup report --since 90d --html leaks.html"""
