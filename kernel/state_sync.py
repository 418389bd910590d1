"""State sync on a replica: encode after a cell, apply others' updates, checkpoint to the store.

Glue between the replica and the pure modules ``ast_effects`` (which names a cell changed) and
``sync_codec`` (serialising them, large values to the store, applying updates, checkpoints).
The executor's library imports are replayed on the standbys in the background
(``module_warmup``); ``NOTEBOOKOS_WARM_IMPORTS=0`` in a replica's environment switches that off
(benchmarks/failover.py measures both ways).
Sync needs a large-object store (``--store-url``); without one the replica still elects and runs
cells, and every cell's output says that standbys did not receive its state.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from notebookos.import_report import ImportReport

if TYPE_CHECKING:  # sync_codec is imported when the sync is set up (it pulls in cloudpickle)
    from .sync_codec import RestoreSplit

# How long after a state-changing cell's Completion commits its checkpoint is written
# (``checkpoint_later``): past the standbys' apply of the update. The checkpoint matters only
# when every replica is lost; the update itself is on a majority once the Completion commits.
CHECKPOINT_AFTER_CHANGE_S = 0.05


# Tests only: seconds each background checkpoint write waits before it starts writing (a replica
# frozen mid-write, as the fault campaign's SIGSTOP did; tests/kernel/test_checkpoint_fence.py).
WRITE_DELAY_VAR = "NOTEBOOKOS_TEST_CHECKPOINT_DELAY_S"


# A cell whose changed names are at most this many plain scalars is encoded on the kernel's
# loop, not on a worker thread: the hop there and back (two GIL handoffs on a loaded 2-core
# VM) took 0.5-0.6 ms of a 0.67 ms encode of ``bench_state = i`` (issue 36, the state-sync
# figure); pickling a few scalars takes tens of microseconds.
LIGHT_NAMES = 8
LIGHT_STR_BYTES = 4096
_SCALARS = (bool, int, float, complex, type(None))


def _light(namespace: Any, names: list[str]) -> bool:
    """Whether ``names`` are few and each is absent (deleted) or a plain scalar or short
    string."""
    if len(names) > LIGHT_NAMES:
        return False
    for name in names:
        value = namespace.get(name)
        kind = type(value)
        if kind in _SCALARS:
            continue
        if kind in (str, bytes) and len(value) <= LIGHT_STR_BYTES:
            continue
        return False
    return True


class StateSync:
    def __init__(
        self,
        store_url: str,
        hmac_key: bytes,
        kernel_id: str,
        threshold_bytes: int,
        log: logging.Logger,
        epoch: int = 0,
    ) -> None:
        self.log = log
        self.kernel_id = kernel_id
        # the kernel's incarnation (NOTEBOOKOS_INCARNATION, raised by each restart): checkpoints
        # are fenced with (epoch, execution_count), so a late write never replaces a newer one
        self.epoch = epoch
        self.checkpoints_refused = 0  # writes the store refused: it held a newer checkpoint
        self.newer_checkpoint: tuple[int, int] | None = None  # the fence that refused the last
        self.store = None
        self.disabled_reason = ""
        # the packages its cells import, for the host to preload (notebookos.import_report)
        self._import_report = ImportReport.from_environment()
        self._encoder = None
        self._applier = None
        self._checkpoint_lock = threading.Lock()
        # a checkpoint write ended (checkpoint_now waits for one under way: one writer at a time)
        self._checkpoint_ended = threading.Condition(self._checkpoint_lock)
        self._checkpoint_wanted = 0  # the execution_count the next checkpoint must cover
        self._checkpoint_written = -1
        self._checkpoint_running = False
        self._checkpoint_on_done: Callable[[int], None] | None = None
        self._checkpoint_timer: threading.Timer | None = None
        self._checkpoint_timer_due = 0.0  # when it fires (time.monotonic)
        # cells that may have changed the namespace (``mark_changed``), and how many of them the
        # last written checkpoint covers: a silent cell leaves execution_count alone, so this is
        # what says whether its effects are in the store yet
        self._generation = 0
        self._generation_written = 0
        self._store_warming = False
        self.last_restore: RestoreSplit | None = None  # the split of the last restore_checkpoint
        if not store_url:
            self.disabled_reason = "the replica was started without --store-url"
            return
        try:
            from notebookos.store import open_store

            from .checkpoint_log import CheckpointLog
            from .module_warmup import LibraryImports, ModuleWarmer
            from .sync_codec import StateApplier, StateEncoder, SyncState

            # a Redis or S3 client (boto3: tens of MB) is made on first use: a standby that
            # never fetches a large object never loads it (issue 18)
            self.store = open_store(store_url, hmac_key, lazy=True)
            # one SyncState shared by encoder and applier: what this replica applied from others
            # is what its encoder compares against (digests) and checkpoints (entries)
            self._state = SyncState()
            self._encoder = StateEncoder(
                self.store, kernel_id, threshold_bytes=threshold_bytes, state=self._state
            )
            self._applier = StateApplier(self.store, state=self._state)
            # the executor's library imports travel to the standbys (module_warmup.py)
            self._imports = LibraryImports()
            self._warmer = ModuleWarmer()
            # a checkpoint writes what changed since the last one (docs/state-sync.md)
            self._checkpoints = CheckpointLog(self.store, kernel_id, epoch=epoch)
        except Exception as exc:  # noqa: BLE001 - reported on every cell, never silent
            self.disabled_reason = f"could not set up state sync: {exc}"
            log.error("state sync disabled: %s", exc)

    @property
    def enabled(self) -> bool:
        return self._encoder is not None

    async def encode_cell(self, shell: Any, code: str) -> tuple[bytes | None, list[str]]:
        """The cell's state update (bytes for the log) and user-facing warnings."""
        if self._encoder is None:
            return None, [f"state sync is off ({self.disabled_reason}); standbys lack this cell"]
        from .ast_effects import analyze_cell

        try:
            source = shell.transform_cell(code)
        except Exception:  # noqa: BLE001 - IPython could not transform: analyse the raw code
            source = code
        effects = analyze_cell(source)
        encoder = self._encoder
        try:
            if (effects.rescan or encoder.holds_tensors()
                    or not _light(shell.user_ns, encoder.candidate_names(shell.user_ns, effects))):
                update = await asyncio.to_thread(encoder.encode, shell.user_ns, effects)
            else:  # the cell touched no name (``1+1``) or only a few scalars (``n = 1``), and
                # no tensor is held: pickling them costs less than the thread's round trip
                update = encoder.encode(shell.user_ns, effects)
        except Exception as exc:  # noqa: BLE001 - never hang or crash the kernel on sync
            self.log.exception("state sync failed")
            return None, [f"state sync failed, standbys lack this cell's changes: {exc}"]
        self.warm_store_once_torch_is_loaded()
        update.modules = self._imports.new()
        self._learn_modules(update.modules, warm=False)
        if not update.entries and not update.warnings and not update.modules:
            return None, []  # no update: standbys have nothing to apply
        return update.to_bytes(), list(update.warnings)

    def warm_store_once_torch_is_loaded(self) -> None:
        """Once the namespace has torch, make the store's client in the background, before the
        first tensor needs it: importing boto3 and making its client took a standby 0.3-0.4 s
        at the start of its first large read (issue 18). A kernel without torch never pays the
        client's memory (tens of MB); one with torch holds hundreds of MB already."""
        store = self.store
        if self._store_warming or "torch" not in sys.modules or getattr(store, "opened", True):
            return
        self._store_warming = True

        def warm() -> None:
            try:
                store.real()  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - the first real use reports it again
                self.log.warning("could not make the store's client ahead of use: %s", exc)

        threading.Thread(target=warm, name="nbos-store-warm", daemon=True).start()

    def prefetch(self, update: bytes) -> None:
        """Start fetching the update's large objects (called on the Raft thread: cheap)."""
        if self._applier is None:
            return
        from .sync_codec import SyncUpdate

        try:
            self._applier.prefetch(SyncUpdate.from_bytes(update))
        except Exception as exc:  # noqa: BLE001 - apply() will report it
            self.log.warning("prefetch failed: %s", exc)

    def apply(self, namespace: MutableMapping[str, Any], update: bytes) -> None:
        if self._applier is None:
            raise RuntimeError(f"cannot apply a state update: {self.disabled_reason}")
        from .sync_codec import SyncUpdate

        self._applier.apply(namespace, SyncUpdate.from_bytes(update))

    def apply_checked(self, namespace: MutableMapping[str, Any], update: bytes) -> dict[str, str]:
        """Apply ``update`` as far as possible; return ``{name: reason}`` for what could not be
        applied (an undecodable update is reported under ``"<update>"``). Never raises: a
        replica records what it lacks instead of carrying on as if it had it."""
        if self._applier is None:
            return {"<state sync>": f"cannot apply a state update: {self.disabled_reason}"}
        from .sync_codec import SyncApplyError, SyncUpdate

        try:
            parsed = SyncUpdate.from_bytes(update)
        except ValueError as exc:
            return {"<update>": str(exc)}
        if parsed.modules and self._import_report is not None:
            # told before the apply, which may import torch for seconds first: a notebook that
            # hibernates meanwhile stops this replica before it would have told
            self._import_report.add(parsed.modules)
        try:
            self._applier.apply(namespace, parsed)
        except SyncApplyError as exc:
            return dict(exc.failures)
        except Exception as exc:  # noqa: BLE001 - reported, never silent
            return {"<update>": f"{type(exc).__name__}: {exc}"}
        finally:
            self.warm_store_once_torch_is_loaded()
            self._learn_modules(parsed.modules)
        return {}

    def _learn_modules(self, names: list[str], warm: bool = True) -> None:
        """Record library modules of the namespace (for checkpoints) and import those this
        replica lacks, in the background: a standby then takes over without importing them."""
        if not names:
            return
        if self._import_report is not None:  # the host learns what to preload
            self._import_report.add(names)
        if warm:  # received: never reported back from here (our own new() already saw them)
            self._imports.known(names)
        with self._state.lock:
            fresh = [name for name in names if name not in self._state.modules]
            self._state.modules.update(dict.fromkeys(fresh))
            self._state.modules_dirty.extend(fresh)
        if warm and os.environ.get("NOTEBOOKOS_WARM_IMPORTS", "1") != "0":
            self._warmer.warm(names)

    def wait_for_imports(self, timeout: float | None = None) -> None:
        """Block until the modules received so far are imported (tests, benchmarks)."""
        if self._applier is not None:
            self._warmer.wait(timeout)

    @staticmethod
    def entry_names(update: bytes) -> set[str]:
        """The names an update sets or deletes (empty when it cannot be decoded)."""
        from .sync_codec import SyncUpdate

        try:
            return {entry.name for entry in SyncUpdate.from_bytes(update).entries}
        except ValueError:
            return set()

    def forget_names(self, namespace: MutableMapping[str, Any], names: set[str]) -> None:
        """Drop ``names`` from the namespace and from what this replica believes is synced."""
        if self._applier is None:
            return
        with self._state.lock:
            for name in names:
                namespace.pop(name, None)
                self._state.entries.pop(name, None)
                self._state.entry_tokens.pop(name, None)
                self._state.identity.unregister(name)
                self._state.dirty.add(name)

    def is_light(self, update: bytes, limit: int = 64 * 1024) -> bool:
        """Small and with nothing to fetch from the store: cheap enough to apply inline."""
        if len(update) > limit or self._applier is None:
            return False
        from .sync_codec import SyncUpdate

        try:
            parsed = SyncUpdate.from_bytes(update)
        except ValueError:
            return False
        return all(e.store_key is None and not e.tensors for e in parsed.entries)

    def checkpoint_in_background(
        self, execution_count: int, on_done: Callable[[int], None]
    ) -> None:
        """Write a full checkpoint of the synced namespace, then call ``on_done(count)``.

        Coalesced: while one checkpoint is being written, further requests only raise the count
        wanted, and one more checkpoint (of the latest state) follows. Quick cells thus cost one
        write per write time rather than one per cell, and the store always ends up holding the
        state after the last completed cell.
        """
        if self._encoder is None or self.store is None:
            return
        with self._checkpoint_lock:
            self._checkpoint_wanted = max(self._checkpoint_wanted, execution_count)
            self._checkpoint_on_done = on_done
            if self._checkpoint_running:
                return
            self._checkpoint_running = True
        threading.Thread(target=self._write_checkpoints, name="notebookos-checkpoint",
                         daemon=True).start()

    def mark_changed(self) -> None:
        """A cell is about to run here: the namespace may differ from the store's checkpoint
        until the next checkpoint is written (``checkpoint_pending``)."""
        with self._checkpoint_lock:
            self._generation += 1

    def checkpoint_pending(self) -> bool:
        """Whether a cell marked by ``mark_changed`` is not covered by a written checkpoint yet
        (False when there is no store to write to)."""
        if self._encoder is None or self.store is None:
            return False
        with self._checkpoint_lock:
            return self._generation > self._generation_written

    def checkpoint_later(
        self, execution_count: int, on_done: Callable[[int], None], delay_s: float = 2.0
    ) -> None:
        """Like ``checkpoint_in_background`` after ``delay_s``: for a cell that changed nothing
        (the store holds its state already, only the checkpoint's cell number lags, at most
        ``delay_s``), and, after a short delay (``CHECKPOINT_AFTER_CHANGE_S``), for one that
        changed state: its write then does not compete for the executor's two cores with the
        announcement of its Completion and the standbys' apply (issue 36), and cells in quick
        succession share one write. A pending timer due later is brought forward."""
        if self._encoder is None or self.store is None:
            return
        due = time.monotonic() + delay_s
        with self._checkpoint_lock:
            self._checkpoint_wanted = max(self._checkpoint_wanted, execution_count)
            self._checkpoint_on_done = on_done
            if self._checkpoint_running:
                return  # the running write goes on with the count wanted
            pending = self._checkpoint_timer
            if pending is not None:
                if self._checkpoint_timer_due <= due:
                    return
                pending.cancel()
            timer = threading.Timer(delay_s, self._checkpoint_timer_fired)
            timer.daemon = True
            self._checkpoint_timer = timer
            self._checkpoint_timer_due = due
        timer.start()

    def checkpoint_now(self, execution_count: int, timeout_s: float = 60.0) -> int:
        """Write a full checkpoint of the synced namespace labelled ``execution_count`` and
        return once it is written (blocking: call it off the kernel's loop). For a replica that
        holds a group's latest state when the group cannot commit any more (lost quorum): the
        Global Scheduler rebuilds the group from it instead of from an older checkpoint.
        Nothing is written when the store's checkpoint is as recent or more (an executor wrote
        it before it died; compared as (epoch, cell), atomically at the store): returns 0 then,
        else ``execution_count``. Raises RuntimeError when
        there is no store, TimeoutError when a background write does not end within
        ``timeout_s``, and the store's error when the write fails."""
        if self._encoder is None or self.store is None:
            raise RuntimeError(f"no store to write a checkpoint to ({self.disabled_reason})")
        from .sync_codec import checkpoint_key

        stored = self.store.fence_of(checkpoint_key(self._encoder.kernel_id))
        if stored is not None and stored >= (self.epoch, execution_count):
            return 0
        with self._checkpoint_ended:  # the log has one writer at a time: wait for its turn
            if not self._checkpoint_ended.wait_for(lambda: not self._checkpoint_running,
                                                   timeout_s):
                raise TimeoutError("a checkpoint being written did not finish")
            self._checkpoint_running = True
            generation = self._generation
        try:
            refused = self._checkpoints.write(self._state, execution_count)
            with self._checkpoint_lock:
                self._checkpoint_written = max(self._checkpoint_written, execution_count)
                self._generation_written = max(self._generation_written, generation)
        finally:
            with self._checkpoint_lock:
                self._checkpoint_running = False
                self._checkpoint_ended.notify_all()
        if refused is not None:
            self._refused(execution_count, refused)
            return 0
        return execution_count

    def _refused(self, count: int, stored: tuple[int, int]) -> None:
        """The store refused this replica's checkpoint of cell ``count``: it holds a newer one
        (another executor's, written while this replica was frozen or cut off). Not an error
        for any cell: this replica's state is the older one, and its cell is not reported as
        checkpointed. Logged and counted (``replica_status``: ``checkpoints_refused``)."""
        with self._checkpoint_lock:
            self.checkpoints_refused += 1
            self.newer_checkpoint = stored
        self.log.warning(
            "checkpoint of cell %d (incarnation %d) refused: the store holds a newer one "
            "(incarnation %d, cell %d), written by another replica while this one lagged; "
            "this replica's state is the older", count, self.epoch, stored[0], stored[1])

    def _checkpoint_timer_fired(self) -> None:
        with self._checkpoint_lock:
            if self._checkpoint_timer is not None and self._checkpoint_timer.is_alive() \
                    and self._checkpoint_timer is not threading.current_thread():
                return  # replaced by an earlier timer (``checkpoint_later``), which runs it
            self._checkpoint_timer = None
            on_done = self._checkpoint_on_done
        if on_done is not None:
            self.checkpoint_in_background(0, on_done)

    def _write_checkpoints(self) -> None:
        while True:
            with self._checkpoint_lock:
                count, on_done = self._checkpoint_wanted, self._checkpoint_on_done
                generation = self._generation
                stale = (count > self._checkpoint_written
                         or generation > self._generation_written)
                if not stale or on_done is None:
                    self._checkpoint_running = False
                    self._checkpoint_ended.notify_all()
                    return
            try:
                delay = float(os.environ.get(WRITE_DELAY_VAR) or 0)
                if delay > 0:  # a test's stand-in for a replica frozen mid-write
                    time.sleep(delay)
                refused = self._checkpoints.write(self._state, count)
            except Exception:  # noqa: BLE001 - the next cell's checkpoint retries
                self.log.exception("checkpoint after cell %d failed", count)
                with self._checkpoint_lock:
                    self._checkpoint_running = False
                    self._checkpoint_ended.notify_all()
                return
            with self._checkpoint_lock:
                self._checkpoint_written = count
                self._generation_written = generation
            if refused is not None:  # a newer checkpoint stays: nothing to report as written
                self._refused(count, refused)
                continue
            try:
                on_done(count)
            except Exception:  # noqa: BLE001
                self.log.exception("after the checkpoint of cell %d", count)

    def restore_checkpoint(self, namespace: MutableMapping[str, Any]) -> tuple[int, list[str]]:
        """Load the store's checkpoint into ``namespace``.

        Returns its execution_count and the names that could not be restored; where the time
        went is then in ``last_restore`` (``RestoreSplit``).
        """
        if self._applier is None or self.store is None:
            raise RuntimeError(f"cannot restore: {self.disabled_reason}")
        from .sync_codec import RestoreSplit, read_checkpoint, restore_namespace

        started = time.monotonic()
        checkpoint = read_checkpoint(self.store, self.kernel_id)
        self.last_restore = RestoreSplit()
        if checkpoint.epoch < self.epoch:  # the kernel was restarted since: it starts empty
            self.log.info("the store's checkpoint (cell %d) is of incarnation %d, before the "
                          "restart to incarnation %d: not restored", checkpoint.execution_count,
                          checkpoint.epoch, self.epoch)
            return 0, []
        if checkpoint.modules and self._import_report is not None:  # before the imports
            self._import_report.add(checkpoint.modules)
        failed = restore_namespace(self.store, checkpoint, namespace, state=self._state,
                                   split=self.last_restore, started=started)
        self._learn_modules(checkpoint.modules)
        return int(checkpoint.execution_count), failed

    def close(self) -> None:
        if self._applier is not None:
            self._warmer.close()
        with self._checkpoint_lock:
            timer, self._checkpoint_timer = self._checkpoint_timer, None
        if timer is not None:
            timer.cancel()
        if self._applier is not None:
            self._applier.close()
        if self.store is not None:
            try:
                self.store.close()
            except Exception:  # noqa: BLE001
                pass
