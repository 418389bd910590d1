"""TensorShare's slowdown predictors (seed 001, sec. 3.2): the paper's MLP (Table 4) in torch,
a ridge regression, the simulator's ground truth (optionally with a fixed per-pair error) and the
interference-blind "every pair is free"; all trained or scored on the 870 records of the 435
pairs of the 29 reference types (``notebookos.workload.interference``). Used by the
``tensorshare`` job policy and by live GPU sharing (``notebookos.policies.gpu_sharing``)."""

from __future__ import annotations

import hashlib
import math

import numpy as np

from notebookos.policies.estimators import single_thread
from notebookos.workload.interference import TYPES, profile, slowdown

LAYERS = (8, 256, 32, 32, 32, 32, 32, 32, 1024, 64, 16, 2)  # Table 4


def training_records() -> tuple[np.ndarray, np.ndarray, list[tuple[str, str]]]:
    """The 870 records: every unordered pair of the 29 types (435, self-pairs included), both
    orders; inputs are the two profiles' four metrics, labels both slowdowns."""
    inputs, labels, pairs = [], [], []
    for i, a in enumerate(TYPES):
        for b in TYPES[i:]:
            for x, y in ((a, b), (b, a)):
                inputs.append(profile(x).features + profile(y).features)
                labels.append((slowdown(x, y), slowdown(y, x)))
                pairs.append((x, y))
    return np.asarray(inputs, dtype=np.float32), np.asarray(labels, dtype=np.float32), pairs


def smape(predicted: np.ndarray, actual: np.ndarray) -> float:
    """Symmetric mean absolute percentage error, in percent (the paper's metric)."""
    return float(100.0 * np.mean(2.0 * np.abs(predicted - actual)
                                 / (np.abs(predicted) + np.abs(actual))))


def _split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    a, b = int(0.6 * n), int(0.8 * n)
    return order[:a], order[a:b], order[b:]


def _fit(torch, net, xt, yt, train: np.ndarray, valid: np.ndarray, epochs: int,  # noqa: ANN001
         patience: int, gen) -> None:  # noqa: ANN001
    """Adam, lr 1e-3, batches of 128, MSE (Table 4's settings); stop when the validation loss has
    not improved for ``patience`` epochs (the paper's search stopped after 50) or after
    ``epochs``, and keep the best weights on the validation split."""
    optimiser = torch.optim.Adam(net.parameters(), lr=1e-3)
    best, best_state, since = math.inf, None, 0
    for _ in range(epochs):
        net.train()
        perm = torch.from_numpy(train)[torch.randperm(len(train), generator=gen)]
        for start in range(0, len(perm), 128):
            batch = perm[start:start + 128]
            optimiser.zero_grad()
            torch.nn.functional.mse_loss(net(xt[batch]), yt[batch]).backward()
            optimiser.step()
        net.eval()
        with torch.no_grad():
            valid_loss = float(torch.nn.functional.mse_loss(net(xt[valid]), yt[valid]))
        if valid_loss < best:
            best, since = valid_loss, 0
            best_state = {k: v.clone() for k, v in net.state_dict().items()}
        else:
            since += 1
            if since >= patience:
                break
    net.load_state_dict(best_state)
    net.eval()


class MLPPredictor:
    """TensorShare's slowdown predictor in torch (imported here: torch is optional).

    Inputs are normalised on the training split (sec. 3.2: the metrics have different units) to
    zero mean and unit variance, and the network learns the increase delta - 1 of each job. Trained
    on delta itself for 300 epochs the two outputs came out equal: the same delta for both jobs
    of every pair, the pair's mean, so the job slowed more was always under-predicted. With the
    paper's min-max scaling (inputs in [0, 1]) or its 50-epoch patience, training stopped on that
    symmetric plateau for most seeds; standardised inputs and a patience of 100 epochs leave it
    for 4 of the seeds 0-4 (seed 3 still stops there), after 330-550 epochs.
    """

    def __init__(self, *, epochs: int = 1000, patience: int = 100, seed: int = 0) -> None:
        try:
            import torch
        except ImportError:
            raise ValueError(
                "tensorshare's default predictor is the paper's MLP, which needs torch, and torch "
                "is not installed here: pip install 'notebookos[torch]', or choose "
                "--policy-param tensorshare.predictor=ridge (a linear model, no torch) or "
                "=oracle (the simulator's ground truth)") from None
        x, y, _ = training_records()
        train, valid, test = _split(len(x), seed)
        self._low = x[train].mean(axis=0)
        self._span = np.maximum(x[train].std(axis=0), 1e-6).astype(np.float32)
        x = self.normalise(x)
        previous_threads = torch.get_num_threads()
        torch.set_num_threads(1)  # deterministic and, for this size, faster
        try:
            gen = torch.Generator().manual_seed(seed)
            torch.manual_seed(seed)
            layers: list = []
            for i in range(len(LAYERS) - 1):
                layers.append(torch.nn.Linear(LAYERS[i], LAYERS[i + 1]))
                if i < len(LAYERS) - 2:
                    layers.append(torch.nn.ReLU())
            net = torch.nn.Sequential(*layers)
            self.parameters = sum(p.numel() for p in net.parameters())
            _fit(torch, net, torch.from_numpy(x), torch.from_numpy(y - 1.0), train, valid,
                 epochs, patience, gen)
            with torch.no_grad():
                self.test_smape = smape(net(torch.from_numpy(x[test])).numpy() + 1.0, y[test])
            self._net = net
            self._torch = torch
        finally:
            torch.set_num_threads(previous_threads)

    def normalise(self, x: np.ndarray) -> np.ndarray:
        return ((x - self._low) / self._span).astype(np.float32)

    def predict(self, a: str, b: str) -> tuple[float, float]:
        torch = self._torch
        row = torch.from_numpy(self.normalise(
            np.asarray([profile(a).features + profile(b).features], dtype=np.float32)))
        with torch.no_grad():
            out = self._net(row)[0].tolist()
        return max(1.0, 1.0 + out[0]), max(1.0, 1.0 + out[1])


class RidgePredictor:
    """A linear model on the 8 metrics and their pairwise products (no torch)."""

    def __init__(self, *, seed: int = 0) -> None:
        from sklearn.linear_model import Ridge

        x, y, _ = training_records()
        train, _valid, test = _split(len(x), seed)
        self.model = Ridge(alpha=1e-3)
        with single_thread():
            self.model.fit(self._expand(x[train]), y[train])
            self.test_smape = smape(self.model.predict(self._expand(x[test])), y[test])

    @staticmethod
    def _expand(x: np.ndarray) -> np.ndarray:
        products = [x[:, i:i + 1] * x[:, j:j + 1] for i in range(4) for j in range(4, 8)]
        return np.hstack([x, *products])

    def predict(self, a: str, b: str) -> tuple[float, float]:
        row = np.asarray([profile(a).features + profile(b).features], dtype=np.float32)
        with single_thread():
            out = self.model.predict(self._expand(row))[0]
        return max(1.0, float(out[0])), max(1.0, float(out[1]))


def _normal(text: str) -> float:
    """A fixed standard-normal draw for ``text`` (Box-Muller on two hashes)."""
    u1, u2 = (int.from_bytes(hashlib.blake2b(f"{salt}:{text}".encode(), digest_size=8).digest(),
                             "big") / 2**64 for salt in ("err1", "err2"))
    return math.sqrt(-2.0 * math.log(max(1e-12, u1))) * math.cos(2.0 * math.pi * u2)


class OraclePredictor:
    """The ground truth (no prediction error: the method's ceiling). With ``error`` > 0, a
    reference for how the violation rate follows the predictor's accuracy: delta of ``a`` beside
    ``b`` is the truth x (1 + error x z), z a fixed standard-normal draw per ordered pair and
    ``seed``, so it errs as a trained predictor does, the same way each time it sees the pair."""

    def __init__(self, error: float = 0.0, seed: int = 0) -> None:
        if error < 0:
            raise ValueError("oracle_error must be >= 0")
        self.error, self.seed = float(error), int(seed)
        self.test_smape = 0.0
        if self.error:
            _, y, pairs = training_records()
            self.test_smape = smape(np.asarray([self.predict(a, b) for a, b in pairs]), y)

    def predict(self, a: str, b: str) -> tuple[float, float]:
        d_a, d_b = slowdown(a, b), slowdown(b, a)
        if not self.error:
            return d_a, d_b
        return (max(1.0, d_a * (1.0 + self.error * _normal(f"{self.seed}|{a}|{b}"))),
                max(1.0, d_b * (1.0 + self.error * _normal(f"{self.seed}|{b}|{a}"))))


class BlindPredictor:
    """Interference-blind sharing (the paper's "GPU sharing" baseline, Kubernetes' GPU-share
    plug-in): every pair is assumed free of slowdown, so any two jobs that fit share."""

    def __init__(self) -> None:
        _, y, _ = training_records()
        self.test_smape = smape(np.ones_like(y), y)

    def predict(self, a: str, b: str) -> tuple[float, float]:
        return 1.0, 1.0
