"""Cloud Functions (2nd gen) entry points: `lister` (HTTP: Cloud Scheduler's tick `{}`,
the jobs topic's push subscription, or a manual `{"backend": ID}`),
`classifier` and `deleter` (Pub/Sub CloudEvents; HTTP JSON also accepted by
posting the same CloudEvent). A raised error makes Pub/Sub redeliver, and after
the maximum attempts the message lands in the dead-letter topic. A held delete gate is
normal operation: a 429 (redelivered), never a 500 whose traceback is logged."""

import functions_framework
from werkzeug.exceptions import TooManyRequests

from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.messages import ListingBatch
from orphan_cleanup.cycle.deleter import GateBusy
from orphan_cleanup.cycle.python_gc import gc_paused
from orphan_cleanup.entrypoints import gcp


@functions_framework.http
def lister(request):
    try:
        summary = gcp.run_lister(request.get_data())
    except ConfigError as e:
        return {"ok": False, "error": str(e)}, 400
    return {"ok": True, **summary}, 200


@functions_framework.cloud_event
@gc_paused  # the batch's decode and classification (orphan_cleanup.cycle.python_gc)
def classifier(cloud_event):
    gcp.pipeline().handle_batch(gcp.parse(ListingBatch, cloud_event.data))


@functions_framework.cloud_event
def deleter(cloud_event):
    try:
        gcp.run_delete(cloud_event.data)
    except GateBusy:
        raise TooManyRequests("the group's delete gate is held: retry later") from None
