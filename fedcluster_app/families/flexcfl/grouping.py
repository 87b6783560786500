"""FlexCFL's pure pieces: the group cold start's measures and clustering, the shift test, the
inter-group aggregation (NumPy, scikit-learn and SciPy; no Flower).

* EDC (the paper's Eq. 5-6): the cosine of each pre-training update to the m leading right
  singular vectors of the un-centred n x d update matrix; k-means++ on those rows.
* MADC (the FedGroup paper's measure): MADC(i, j) = 1/(n-2) sum_{z != i, j}
  |cos(dw_i, dw_z) - cos(dw_j, dw_z)|, clustered by complete-linkage agglomerative clustering.
* The label-shift test (Eq. 9): a client has shifted when the distance between its label
  counts now and at its last (re-)assignment exceeds tau = fraction x n_orig / C.
* Inter-group aggregation (Eq. 7, normalised): w_j = sum_l a_jl w_l / sum_l a_jl with a_jj = 1,
  a_jl = eta_g / ||w_l||.
"""

from __future__ import annotations

import base64

import numpy as np

EPS = 1e-12
Weights = list[np.ndarray]


def flatten(weights: Weights) -> np.ndarray:
    """All layers concatenated in state_dict order, float64."""
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in weights])


def unflatten(vec: np.ndarray, like: Weights) -> Weights:
    out, pos = [], 0
    for a in like:
        out.append(vec[pos : pos + a.size].reshape(a.shape).astype(np.float32))
        pos += a.size
    return out


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / ((np.linalg.norm(a) + EPS) * (np.linalg.norm(b) + EPS)))


def edc_embedding(updates: np.ndarray, m: int) -> np.ndarray:
    """M_d[i, k] = cos(dw_i, v_k), v_k the top-m right singular vectors of the un-centred
    n x d update matrix; EDC(i, j) = ||M_d[i] - M_d[j]|| / m."""
    _, _, vt = np.linalg.svd(updates, full_matrices=False)
    v = vt[:m]                                           # (m, d), unit rows
    norms = np.linalg.norm(updates, axis=1, keepdims=True) + EPS
    md = (updates @ v.T) / norms
    if md.shape[1] < m:                                  # rank < m: pad (never the case for d >> n)
        md = np.pad(md, ((0, 0), (0, m - md.shape[1])))
    return md


def edc_kmeans(md: np.ndarray, m: int, seed: int) -> np.ndarray:
    """k-means++ (n_init 10, max_iter 20, fixed seed) on the rows of M_d."""
    import warnings

    from sklearn.cluster import KMeans

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "fewer distinct clusters than n_clusters": handled
        km = KMeans(n_clusters=m, init="k-means++", max_iter=20, n_init=10, random_state=seed)
        return km.fit(md).labels_.astype(int)


def cosine_matrix(updates: np.ndarray) -> np.ndarray:
    """S[i, j] = cos(dw_i, dw_j) over the rows of the n x d update matrix."""
    unit = updates / (np.linalg.norm(updates, axis=1, keepdims=True) + EPS)
    return unit @ unit.T


def madc_matrix(sim: np.ndarray) -> np.ndarray:
    """MADC(i, j) = 1/(n-2) sum_{z != i, j} |S(i, z) - S(j, z)| of an n x n similarity matrix
    (the FedGroup paper's measure; the authors' ``_calculate_data_driven_measure`` with
    ``correction=True``); zero diagonal, symmetric. n <= 2 gives zeros (no third client)."""
    sim = np.asarray(sim, dtype=np.float64)
    n = sim.shape[0]
    if sim.shape != (n, n):
        raise ValueError(f"MADC needs a square similarity matrix, got shape {sim.shape}")
    out = np.zeros((n, n))
    if n <= 2:
        return out
    idx = np.arange(n)
    for i in range(n):
        diff = np.abs(sim[i][None, :] - sim)            # diff[j, z] = |S(i, z) - S(j, z)|
        total = diff.sum(axis=1)
        total -= diff[:, i]                              # leave out z = i ...
        total -= diff[idx, idx]                          # ... and z = j (same term when j = i)
        total[i] = 0.0
        out[i] = total / (n - 2)
    return (out + out.T) / 2.0                           # exact already; removes rounding asymmetry


def madc_cluster(dissimilarity: np.ndarray, m: int) -> np.ndarray:
    """Agglomerative clustering, complete linkage, on a precomputed dissimilarity."""
    from sklearn.cluster import AgglomerativeClustering

    n = dissimilarity.shape[0]
    if m >= n:
        return np.arange(n)
    ac = AgglomerativeClustering(n_clusters=m, metric="precomputed", linkage="complete")
    return ac.fit(dissimilarity).labels_.astype(int)


def rac_group(seed: int, server_round: int, cid: int, groups: list[int]) -> int:
    """RAC: a uniformly random group, drawn from a generator keyed on (seed,
    round, client): deterministic per seed, independent of the order of cold starts and of a
    resume."""
    groups = sorted(groups)
    draw = np.random.default_rng([seed, 0x5AC, server_round, cid]).integers(len(groups))
    return groups[int(draw)]


def shift_distance(metric: str, counts: np.ndarray, ref: np.ndarray) -> float:
    """``scipy_counts``: scipy's 1-D Wasserstein distance between the two count vectors taken as
    samples of C values (label identity ignored; the paper's code); ``tv``: total variation of
    the label distributions (label-aware)."""
    counts, ref = np.asarray(counts, float), np.asarray(ref, float)
    if metric == "scipy_counts":
        from scipy.stats import wasserstein_distance

        return float(wasserstein_distance(counts, ref))
    a, b = counts.sum(), ref.sum()
    if a <= 0 and b <= 0:
        return 0.0
    if a <= 0 or b <= 0:
        return 1.0
    return float(0.5 * np.abs(counts / a - ref / b).sum())


def shift_threshold(metric: str, fraction: float, n_orig: int, num_classes: int) -> float:
    """tau_i = fraction * n_orig / C for ``scipy_counts`` (Eq. 9), ``fraction`` for ``tv``."""
    return fraction * n_orig / num_classes if metric == "scipy_counts" else fraction


def inter_group_aggregate(models: dict[int, np.ndarray], eta_g: float) -> dict[int, np.ndarray]:
    """Inter-group aggregation in the authors' code's normalised form (docs/flexcfl/README.md, D6):
    w_j = sum_l a_jl w_l / sum_l a_jl with a_jj = 1, a_jl = eta_g / ||w_l|| for l != j, norms
    from the inputs, all groups at once."""
    if eta_g == 0 or len(models) < 2:
        return dict(models)
    ids = sorted(models)
    inv = {g: eta_g / (np.linalg.norm(models[g]) + EPS) for g in ids}
    out = {}
    for j in ids:
        coeff = {l: (1.0 if l == j else inv[l]) for l in ids}
        total = sum(coeff.values())
        out[j] = sum(coeff[l] * models[l] for l in ids) / total
    return out


def nearest_model(vec: np.ndarray, candidates: dict[int, np.ndarray]) -> int:
    """The candidate id with the smallest L2 distance to ``vec`` (ties: the lowest id)."""
    return min(sorted(candidates), key=lambda k: float(np.linalg.norm(vec - candidates[k])))


def encode(vec: np.ndarray) -> str:
    return base64.b64encode(np.asarray(vec, dtype=np.float64).tobytes()).decode()


def decode(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=np.float64).copy()
