"""The help texts of ``orphans`` and ``events`` (what operators watch)."""

ORPHANS_EPILOG = """The orphans found and not deleted yet (open, deleting, delete_failed), across cycles, of every
backend or one: ref, region, primary id, resources, size as the listing read it (instance or
machine type, GPUs where the API gives them, disk GB, addresses), first and last seen, the last
action, the reason. With a backend's `prices` setting (the operator's own prices, never fetched:
README.md, "Open orphans and what they cost"), an estimated cost per hour and since first seen,
and a total per backend. Read-only: never changes the database (migrate first).

examples:
  orphan-cleanup orphans
  orphan-cleanup orphans --backend aws-prod --json | jq 'map(.cost_so_far) | add'
  orphan-cleanup backend update aws-prod --settings '{"prices": {"instance_hour": {"m5.large": 0.096},
      "disk_gb_month": 0.08, "address_hour": 0.005}}'"""
EVENTS_EPILOG = """The events table (README.md, "The events table"): one row per reported orphan or protected
group, deletion, failed delete, cycle failure and backend removal, oldest first. --since takes
a number and a unit (s, m, h, d). Read-only: never changes the database (migrate first).

examples:
  orphan-cleanup events --since 6h
  orphan-cleanup events --backend aws-prod --since 7d --json | jq 'map(select(.kind == "delete_failed"))'"""
