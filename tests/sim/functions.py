"""The functions as the queues drive them (a mixin of ``Simulation``): Lambda's
SQS poller with batches of records and partial batch failures (one record per
invocation for the lister's jobs, as template.yaml sets it), crashes before or
after a record, and the hooks ``SimProvider`` calls around each group's deletion
(attribution to a cycle, concurrent deleters, lister runs and listing jobs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orphan_cleanup.core.errors import ProviderError, ResourceInUse
from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.core.messages import DeleteRequest, ListingBatch, ListingJob
from orphan_cleanup.core.verdicts import DeleteResult
from orphan_cleanup.cycle.deleter import GateBusy
from tests.sim.queues import VISIBILITY_TIMEOUT, SimQueue


class Functions:
    def deliver_batch(self) -> None:
        self._checked(lambda: self._invoke(self.listing_q, self._handle_listing, "classifier"))

    def deliver_delete(self) -> None:
        self._checked(lambda: self._invoke(self.delete_q, self._handle_delete, "deleter"))

    def deliver_job(self) -> None:
        self._checked(lambda: self._invoke(self.jobs_q, self._handle_job, "lister job", batch=1))

    def _invoke(self, queue: SimQueue, handle: Callable[[Any], int | None], name: str, batch: int = 4) -> None:
        """One function invocation with a batch of records (SQS gives up to 10). A record
        that raises fails alone (``batchItemFailures``); a crash of the function itself
        returns every record of the batch to the queue, handled or not."""
        records = queue.take_many(self.rng_sched.randint(1, batch) if batch > 1 else 1)
        for i, msg in enumerate(records):
            if self.dice.roll("crash_before_handler"):
                self.trace(f"{name}: function crashed before record {i + 1}/{len(records)}")
                for m in records:
                    queue.nack(m)
                return
            retry_in = handle(msg)
            if self.dice.roll("crash_after_handler"):
                self.trace(f"{name}: function crashed after record {i + 1}/{len(records)}")
                for m in records:
                    queue.nack(m)
                return
            if retry_in is None:
                queue.ack(msg)
            else:
                queue.nack(msg, delay=retry_in)

    def _handle_listing(self, msg: Any) -> int | None:
        """The classifier's record handler: None when done, else seconds until redelivery."""
        batch = ListingBatch.model_validate_json(msg.body)
        try:
            result = self.pipeline.handle_batch(batch)
        except Exception as exc:  # noqa: BLE001 - the record fails and is redelivered
            self._crash("classifier", exc, (batch.backend,))
            return VISIBILITY_TIMEOUT
        self.trace(f"classifier: batch {batch.seq}{' (last)' if batch.last else ''} of {batch.cycle_id[:8]}"
                   f" -> {result.status} {result.verdicts or ''}")
        return None

    def _handle_job(self, msg: Any) -> int | None:
        """The lister's job record handler: None when done, else seconds until redelivery."""
        job = ListingJob.model_validate_json(msg.body)
        self.listing_record = None
        try:
            result = self.pipeline.run_job(job)
        except Exception as exc:  # noqa: BLE001 - the record fails and is redelivered
            self._crash("lister job", exc, job.backends)
            return self.jobs_q.visibility_timeout
        started = sum(1 for r in result.results if r.started)
        self.work["listing_jobs"] += 1
        if result.listings < started:
            self.work["shared_listings"] += 1
        for r in result.results:
            self.job_reasons.setdefault(r.backend, r.reason)
            if r.reason == "no_activity":
                self.checker.no_activity_skip(r.backend)
        self.trace(f"lister job {list(job.backends)}: {result.listings} listing(s) for {started} started; "
                   + ", ".join(f"{r.backend}:{r.reason}" + (f" cycle={r.cycle_id[:8]}" if r.cycle_id else "")
                               for r in result.results))
        return None

    def batch_published(self, batch: Any) -> None:
        """A listing batch left the lister: the listing running now fed its cycle (I2)."""
        self.checker.listing_fed(batch.cycle_id, batch.backend, self.listing_record)

    def _handle_delete(self, msg: Any, again: bool = False) -> int | None:
        """The deleter's record handler: None when done, else seconds until redelivery."""
        req = DeleteRequest.model_validate_json(msg.body)
        self.delete_ctx.append(req)
        self.in_delivery.add(msg.id)
        try:
            status = self.pipeline.handle_delete(req)
        except GateBusy:
            self.trace(f"deleter: {req.group.key} gate busy, retried later")
            self.checker.gate_refused(req.cycle_id, req.group.provider_ref)
            return self.rng_sched.randint(5, 60)
        except Exception as exc:  # noqa: BLE001 - the record fails and is redelivered
            self._crash("deleter", exc, (req.backend,))
            return VISIBILITY_TIMEOUT
        finally:
            self.delete_ctx.pop()
            if not again:
                self.in_delivery.discard(msg.id)
        self.trace(f"deleter: {req.group.key} of {req.cycle_id[:8]} -> {status}")
        self.checker.delete_done(req.cycle_id, req.group)
        if status == "region_tripped":
            self.checker.region_tripped(req.cycle_id, req.group.region)
        return None

    def resources_in_messages(self) -> tuple[set[str], set[str]]:
        """Resource ids named by waiting delete requests, and by waiting listing batches."""
        listed: set[str] = set()
        for msg in self.listing_q.messages:
            for g in ListingBatch.model_validate_json(msg.body).groups:
                listed.update(g.resource_ids())
        deleting: set[str] = set()
        for msg in self.delete_q.messages:
            deleting.update(DeleteRequest.model_validate_json(msg.body).group.resource_ids())
        return deleting, listed

    # ---- hooks called by SimProvider -------------------------------------------------

    def _cycle(self) -> str | None:
        return self.delete_ctx[-1].cycle_id if self.delete_ctx else None

    def provider_call_started(self, group: ResourceGroup) -> None:
        self.checker.provider_call_started(self._cycle(), group)

    def provider_call_finished(self, group: ResourceGroup) -> None:
        self.checker.provider_call_finished(group)

    def provider_touched(self, group: ResourceGroup, touched: list[str], before: dict[str, Any],
                         retain_days: int | None) -> None:
        self.checker.provider_touched(self._cycle(), group, touched, before, retain_days)

    def provider_result(self, group: ResourceGroup, result: DeleteResult | ProviderError) -> None:
        cid = self._cycle()
        if cid is not None:
            answer = result.status.value if isinstance(result, DeleteResult) else type(result).__name__
            self.checker.results[cid][group.key] = answer
        self.checker.provider_answered(cid, group, result.protection if isinstance(result, DeleteResult) else None)
        in_use = [s.id for s in result.skipped if s.reason == "in_use"] if isinstance(result, DeleteResult) \
            else [group.key] if isinstance(result, ResourceInUse) else []
        self.checker.in_use_answered(cid, group, in_use)

    def concurrent_work(self, group: ResourceGroup) -> None:
        """While a provider delete is in flight, other pieces of the cleanup run."""
        if len(self.delete_ctx) > 1:
            return
        current = [m for m in self.delete_q.messages if m.id in self.in_delivery]
        if current and self.dice.roll("visibility_timeout"):
            self.trace(f"concurrently: message {current[0].id} is redelivered (visibility timeout)")
            current[0].receives += 1
            self._handle_delete(current[0], again=True)
        if self.dice.roll("concurrent_delete"):
            ready = [m for m in self.delete_q.ready() if m.id not in self.in_delivery]
            same = [m for m in ready if DeleteRequest.model_validate_json(m.body).group.provider_ref
                    == group.provider_ref]
            pool = same if same and self.rng_sched.random() < 0.5 else ready
            if pool:
                msg = self.rng_sched.choice(pool)
                msg.receives += 1
                self.trace(f"concurrently: another deleter takes message {msg.id}")
                retry_in = self._handle_delete(msg)
                if retry_in is None:
                    self.delete_q.ack(msg)
                else:
                    self.delete_q.nack(msg, delay=retry_in)
        if self.dice.roll("concurrent_lister"):
            jobs = self.jobs_q.ready()
            if jobs and self.rng_sched.random() < 0.5:
                msg = self.rng_sched.choice(jobs)
                msg.receives += 1
                self.trace(f"concurrently: a listing job (message {msg.id}) overlaps the delete")
                retry_in = self._handle_job(msg)
                if retry_in is None:
                    self.jobs_q.ack(msg)
                else:
                    self.jobs_q.nack(msg, delay=retry_in)
            else:
                self.trace("concurrently: a lister run overlaps the delete")
                self.scheduled(nested=True)
