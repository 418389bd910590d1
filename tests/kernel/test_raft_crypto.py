"""Raft traffic's AEAD (kernel/raft_crypto.py): the standard ChaCha20-Poly1305, tokens that
cannot be changed or forged, the same tokens from libsodium and from ``cryptography``, and a
replica that no longer loads ``cryptography`` (issue 36: 9 MB of each replica's memory)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from notebookos.kernel.raft_crypto import (
    InvalidToken,
    RaftCipher,
    _Cryptography,
    load_libsodium,
    raft_key,
)

SODIUM = load_libsodium()
BACKENDS = [pytest.param(_Cryptography(), id="cryptography"),
            pytest.param(SODIUM, id="libsodium",
                         marks=pytest.mark.skipif(SODIUM is None, reason="no libsodium"))]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_aead_is_rfc_8439_chacha20_poly1305(backend):
    key = bytes(range(0x80, 0xA0))
    nonce = bytes.fromhex("070000004041424344454647")
    ad = bytes.fromhex("50515253c0c1c2c3c4c5c6c7")
    text = (b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for "
            b"the future, sunscreen would be it.")
    sealed = backend.seal(key, nonce, text, ad)
    assert sealed[:16].hex() == "d31a8d34648e60db7b86afbc53ef7ec2"
    assert sealed[-16:].hex() == "1ae10b594f09e26a7e902ecbd0600691"
    assert backend.open(key, nonce, sealed, ad) == text


@pytest.mark.parametrize("sender", BACKENDS)
@pytest.mark.parametrize("receiver", BACKENDS)
def test_tokens_round_trip_between_backends(sender, receiver):
    key = raft_key(b"kernel key")
    token = RaftCipher(key, sender).encrypt_at_time(b"raft message" * 50, 1234)
    assert b"raft message" not in token
    cipher = RaftCipher(key, receiver)
    assert cipher.extract_timestamp(token) == 1234
    assert cipher.decrypt(token) == b"raft message" * 50
    assert cipher.decrypt(bytearray(token)) == b"raft message" * 50


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_changed_byte_anywhere_in_a_token_is_refused(backend):
    cipher = RaftCipher(raft_key(b"k"), backend)
    token = cipher.encrypt_at_time(b"payload", 99)
    for i in range(len(token)):
        bad = bytearray(token)
        bad[i] ^= 0x01
        with pytest.raises(InvalidToken):
            cipher.extract_timestamp(bytes(bad))
        with pytest.raises(InvalidToken):
            cipher.decrypt(bytes(bad))
    for cut in (0, 5, 21, 36, len(token) - 1):
        with pytest.raises(InvalidToken):
            cipher.decrypt(token[:cut])


@pytest.mark.parametrize("backend", BACKENDS)
def test_another_kernels_key_cannot_read_or_forge(backend):
    token = RaftCipher(raft_key(b"k1"), backend).encrypt_at_time(b"payload", 1)
    with pytest.raises(InvalidToken):
        RaftCipher(raft_key(b"k2"), backend).extract_timestamp(token)


def test_nonces_are_fresh():
    cipher = RaftCipher(raft_key(b"k"))
    tokens = {cipher.encrypt_at_time(b"same", 1) for _ in range(100)}
    assert len(tokens) == 100


def test_a_replica_does_not_load_cryptography_and_refuses_a_pysyncobj_password():
    code = (
        "import sys\n"
        "from notebookos.kernel import app\n"
        "from notebookos.kernel.raft_log import RaftLog\n"
        "assert 'cryptography' not in sys.modules, sorted(m for m in sys.modules if 'crypt' in m)\n"
        "import pysyncobj\n"
        "try:\n"
        "    pysyncobj.SyncObj('127.0.0.1:1', [], pysyncobj.SyncObjConf(password='p'))\n"
        "except Exception as e:\n"
        "    print('refused', type(e).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "refused" in out.stdout


def test_a_forked_child_never_reuses_its_parents_nonces():
    cipher = RaftCipher(raft_key(b"k"))
    cipher.encrypt_at_time(b"x", 1)  # the parent has drawn a block of nonces
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next nonces, to the parent
        os.write(write, b"".join(cipher.encrypt_at_time(b"x", 1)[9:21] for _ in range(8)))
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 12 * 8)
    os.close(read)
    parent = b"".join(cipher.encrypt_at_time(b"x", 1)[9:21] for _ in range(8))
    assert len(child) == 12 * 8
    assert not {child[i:i + 12] for i in range(0, 96, 12)} & {parent[i:i + 12]
                                                              for i in range(0, 96, 12)}
