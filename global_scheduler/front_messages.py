"""What a front checks of every message it routes: the signature (HMAC, no replay) and the
frames, without decoding more than routing needs; what it drops is counted here and in the
hooks' metrics. Mixed into ``KernelFront``.
"""

from __future__ import annotations

import hmac
import logging
from collections import OrderedDict
from typing import Any

from notebookos.global_scheduler.front_hooks import call_optional

log = logging.getLogger(__name__)


class MessageChecks:
    def _init_checks(self) -> None:
        self.bad_signatures = 0
        self.malformed = 0
        # The session's HMAC and decoder, read once: both are traitlets (~0.7 us a read), and
        # a trivial cell has the front check or make 8 signatures and decode 17 frames
        # (issue 36). The session's key never changes after the front is made.
        self._auth = self.session.auth
        self._unpack = self.session.unpack

    def _sign(self, parts: list[bytes]) -> bytes:
        """``Session.sign``: the hex HMAC of ``parts`` (b"" without a key)."""
        if self._auth is None:
            return b""
        h = self._auth.copy()
        for part in parts:
            h.update(part)
        return h.hexdigest().encode()

    def _dropped(self, reason: str) -> None:
        """Count a dropped message: here (the kernel's status) and in the hooks' metrics."""
        if reason == "bad_signature":
            self.bad_signatures += 1
        else:
            self.malformed += 1
        call_optional(self.hooks, "message_dropped", self.kernel_id, reason)

    def _verify(self, msg_list: list[bytes], content: bool = True) -> dict | None:
        """``Session.deserialize``'s checks (signature, no replay, at least five frames) and
        JSON decoding, without its date parsing and version adaptation: the front only routes,
        so header dates stay strings and every message is version 5 (both sides are
        jupyter_client sessions). ``content=False`` leaves the content frame undecoded."""
        try:
            if len(msg_list) < 5:
                raise TypeError(f"malformed message: {len(msg_list)} frames, need 5")
            if self._auth is not None:
                signature = msg_list[0]
                if not signature:
                    raise ValueError("unsigned message")
                if signature in self.session.digest_history:
                    raise ValueError("duplicate signature")
                if not hmac.compare_digest(signature, self._sign(msg_list[1:5])):
                    raise ValueError("invalid signature")
                self.session._add_digest(signature)  # noqa: SLF001 - the replay guard's store
            unpack = self._unpack
            msg = {"header": unpack(msg_list[1]), "parent_header": unpack(msg_list[2]),
                   "metadata": unpack(msg_list[3]), "buffers": msg_list[5:]}
            if content:
                msg["content"] = unpack(msg_list[4])
            return msg
        except (ValueError, TypeError, KeyError) as exc:
            self._dropped("bad_signature")
            log.warning("kernel %s: dropped a message: %s", self.kernel_id, str(exc)[:120])
            return None

    def _verify_quiet(self, msg_list: list[bytes]) -> dict | None:
        unpack = self._unpack
        try:  # already verified once: the digest is in the history, so skip that check
            return {"header": unpack(msg_list[1]), "parent_header": unpack(msg_list[2]),
                    "metadata": unpack(msg_list[3]), "content": unpack(msg_list[4])}
        except (ValueError, TypeError, IndexError):
            return None

    def _signature_ok(self, msg_list: list[bytes]) -> bool:
        """The HMAC check of ``Session.deserialize`` without decoding the content."""
        if self._auth is None:
            return True
        expected = self._sign(msg_list[1:5])
        if hmac.compare_digest(expected, msg_list[0]):
            return True
        self._dropped("bad_signature")
        log.warning("kernel %s: dropped a message: invalid signature", self.kernel_id)
        return False

    @staticmethod
    def _remember(table: OrderedDict, key: str, value: Any, limit: int = 4096) -> None:
        table[key] = value
        while len(table) > limit:
            table.popitem(last=False)

