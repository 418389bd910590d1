"""Errors the Global Scheduler's parts raise to each other."""

from __future__ import annotations

import grpc


class StartError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
