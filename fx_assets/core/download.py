"""Databento downloads into the raw layout: quote the cost, fetch each (symbol, schema, quarter)
file with the official ``databento`` client, and land it atomically.

One request per (symbol, schema, quarter): ``dataset``, parent symbology (``stype_in="parent"``,
e.g. ``ES.FUT``: every outright and calendar spread of the root), ``start`` = the quarter's first
day, ``end`` = the next quarter's first day (exclusive). Its file goes to
``raw/{schema}/{SYMBOL}/{SYMBOL}_{YYYY}-Q{n}.dbn.zst`` (:class:`fx_assets.core.paths.DataLayout`).

Rules this module keeps:

- **Cost first.** :func:`quote` asks ``metadata.get_cost``, ``get_billable_size`` and
  ``get_record_count`` for every file still missing; the caller shows them and decides
  (:func:`check_budget` refuses a total above a limit). Files already present are not quoted.
- **Complete or absent.** A file appears under its final name only once it is whole: a streamed
  file is written to a temporary name beside it (:func:`fx_assets.core.atomic.atomic_path`), its
  zstd frames are checked (a truncated ``.dbn.zst`` still decodes, with fewer records), then it is
  renamed. An interrupted download leaves nothing under the final name; the next run restarts
  it. A file under its final name is complete and is skipped without a request.
- **Stream or batch.** Databento recommends batch jobs above 5 GB (a stream is billed every time
  it is sent; batch files re-download free for 30 days). A request whose billable size
  (uncompressed DBN) exceeds ``batch_threshold_bytes`` (default 5 GB) goes through
  ``batch.submit_job`` (one file per quarter, ``split_duration="none"``); its job id is kept in
  ``.{file}.batch.json`` beside the final file so that a rerun polls the same job instead of
  paying again, and its staged file (``.{file}.batch/``) resumes with HTTP ranges. The staged
  file is checked against the manifest's SHA-256 and its zstd frames before the rename.
- **The API key** comes from ``DATABENTO_API_KEY`` and is never printed: every error message is
  passed through :func:`scrub` before it leaves this module.

No Dagster import: the CLI (``fx-assets download``) and the ``download_raw`` job both call this.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

from fx_assets.core.atomic import atomic_path, atomic_write_text
from fx_assets.core.calendar import next_quarter, quarter_label
from fx_assets.core.paths import RAW_SCHEMAS, DataLayout

API_KEY_ENV = "DATABENTO_API_KEY"
#: Databento's guidance: batch downloads for requests above 5 GB (billable = uncompressed DBN bytes).
BATCH_THRESHOLD_BYTES = 5_000_000_000
#: Seconds between batch-job polls, and the longest wait for a job to be done.
BATCH_POLL_SECONDS = 15.0
BATCH_TIMEOUT_SECONDS = 6 * 3600.0

#: progress(label, bytes_done, bytes_total or None)
Progress = Callable[[str, int, int | None], None]


class DownloadError(RuntimeError):
    """A download could not be done; the message names the file and never holds the API key."""


class MissingApiKeyError(DownloadError):
    pass


class BudgetExceededError(DownloadError):
    pass


def api_key_from_env(env: Mapping[str, str] | None = None) -> str:
    """The key from ``DATABENTO_API_KEY``; a one-line error naming the variable when unset."""
    key = (os.environ if env is None else env).get(API_KEY_ENV, "")
    if not key.strip():
        raise MissingApiKeyError(f"{API_KEY_ENV} is not set: export {API_KEY_ENV}=<your Databento API key>")
    return key


def scrub(text: str, key: str | None) -> str:
    """``text`` with every occurrence of the API key replaced (servers may echo what they got)."""
    return text.replace(key, "***") if key else text


def make_client(key: str, gateway: str | None = None) -> Any:
    """A ``databento.Historical`` client (``gateway`` None = Databento's default)."""
    import databento as db

    kwargs: dict[str, Any] = {"key": key}
    if gateway:
        kwargs["gateway"] = gateway
    return db.Historical(**kwargs)


# --- what to fetch --------------------------------------------------------------------------


@dataclass(frozen=True)
class FileRequest:
    """One (dataset, symbol, schema, quarter) file."""

    dataset: str
    symbol: str
    schema: str
    quarter: dt.date

    @property
    def label(self) -> str:
        return f"{self.symbol} {self.schema} {quarter_label(self.quarter)}"

    @property
    def start(self) -> str:
        return self.quarter.isoformat()

    @property
    def end(self) -> str:
        return next_quarter(self.quarter).isoformat()

    def params(self) -> dict[str, Any]:
        """The request fields the metadata, timeseries and batch calls share."""
        return {
            "dataset": self.dataset,
            "symbols": [self.symbol],
            "schema": self.schema,
            "stype_in": "parent",
            "start": self.start,
            "end": self.end,
        }


def plan(
    dataset: str,
    symbols: Sequence[str],
    schemas: Sequence[str],
    quarters: Sequence[dt.date],
    *,
    today: dt.date | None = None,
) -> list[FileRequest]:
    """Every (symbol, schema, quarter) request, checked: known schemas, parent symbols (the
    client would otherwise send ALL_SYMBOLS for an empty list), complete quarters only (an
    incomplete quarter's file would later pass for complete and be skipped forever)."""
    if not dataset.strip():
        raise ValueError("--dataset is empty")
    if not symbols:
        raise ValueError("no symbols given (an empty list would request every symbol of the dataset)")
    for s in symbols:
        if not s or any(c in s for c in "|[],/ ") or s != s.upper():
            raise ValueError(f"symbol {s!r}: expected an upper-case parent symbol such as ES.FUT")
    for schema in schemas:
        if schema not in RAW_SCHEMAS:
            raise ValueError(f"schema {schema!r}: the raw layout holds {', '.join(RAW_SCHEMAS)}")
    if not schemas:
        raise ValueError("no schemas given")
    today = today or dt.datetime.now(dt.UTC).date()
    for q in quarters:
        if next_quarter(q) > today:
            raise ValueError(
                f"{quarter_label(q)} is not complete yet (it ends {next_quarter(q).isoformat()}); "
                "download complete quarters only"
            )
    return [FileRequest(dataset, sym, schema, q) for sym in symbols for schema in schemas for q in quarters]


# --- cost -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quote:
    """What one file costs, or that it is already on disk (then nothing is asked)."""

    request: FileRequest
    path: Path
    present: bool
    cost_usd: float = 0.0
    billable_bytes: int = 0
    record_count: int = 0
    method: str = "present"  # "present" | "stream" | "batch"

    def to_dict(self) -> dict[str, Any]:
        return {
            "symbol": self.request.symbol,
            "schema": self.request.schema,
            "quarter": quarter_label(self.request.quarter),
            "path": str(self.path),
            "present": self.present,
            "cost_usd": self.cost_usd,
            "billable_bytes": self.billable_bytes,
            "record_count": self.record_count,
            "method": self.method,
        }


@dataclass(frozen=True)
class QuoteTotal:
    files: int
    to_fetch: int
    cost_usd: float
    billable_bytes: int
    record_count: int


def total(quotes: Iterable[Quote]) -> QuoteTotal:
    qs = list(quotes)
    todo = [q for q in qs if not q.present]
    return QuoteTotal(
        files=len(qs),
        to_fetch=len(todo),
        cost_usd=sum(q.cost_usd for q in todo),
        billable_bytes=sum(q.billable_bytes for q in todo),
        record_count=sum(q.record_count for q in todo),
    )


class _Translate:
    """Turns the client's exceptions into one-line :class:`DownloadError` messages (key scrubbed)."""

    def __init__(self, key: str | None) -> None:
        self.key = key

    @contextlib.contextmanager
    def __call__(self, what: str) -> Iterator[None]:
        from databento.common.error import BentoError, BentoHttpError
        from requests import RequestException

        try:
            yield
        except DownloadError as exc:
            raise DownloadError(scrub(str(exc), self.key)) from None
        except BentoHttpError as exc:
            status = exc.http_status
            hint = {
                401: f" (check {API_KEY_ENV})",
                402: " (payment required: check the account's billing)",
                403: " (the key has no access to this dataset)",
                429: " (rate limited: retry later)",
            }.get(status or 0, " (server error: retry later)" if (status or 0) >= 500 else "")
            lines = str(exc.message or exc.json_body or "").splitlines()
            detail = scrub("; ".join(x.strip() for x in lines if x.strip()), self.key) or "<empty message>"
            raise DownloadError(f"{what}: Databento answered HTTP {status}: {detail}{hint}") from None
        except (BentoError, RequestException, OSError, ValueError) as exc:
            raise DownloadError(f"{what}: {scrub(str(exc), self.key)}") from None
        except Exception as exc:  # e.g. databento_dbn.DBNError when the client decodes a cut body
            raise DownloadError(f"{what}: {type(exc).__name__}: {scrub(str(exc), self.key)}") from None


def quote(
    client: Any,
    requests: Sequence[FileRequest],
    layout: DataLayout,
    *,
    key: str | None = None,
    batch_threshold_bytes: int = BATCH_THRESHOLD_BYTES,
) -> list[Quote]:
    """Cost, billable size and record count of every file not yet on disk."""
    tr = _Translate(key)
    out: list[Quote] = []
    for req in requests:
        path = layout.raw_file(req.schema, req.symbol, req.quarter)
        if path.is_file():
            out.append(Quote(req, path, present=True))
            continue
        p = req.params()
        with tr(f"{req.label}: cost query"):
            cost = float(client.metadata.get_cost(**p))
            size = int(client.metadata.get_billable_size(**p))
            count = int(client.metadata.get_record_count(**p))
        method = "batch" if size > batch_threshold_bytes else "stream"
        out.append(Quote(req, path, False, cost, size, count, method))
    return out


def check_budget(quotes: Iterable[Quote], max_cost_usd: float | None) -> QuoteTotal:
    """The total; :class:`BudgetExceededError` when it is above ``max_cost_usd``."""
    t = total(quotes)
    if max_cost_usd is not None and t.cost_usd > max_cost_usd:
        raise BudgetExceededError(
            f"estimated cost ${t.cost_usd:,.2f} for {t.to_fetch} file(s) is above --max-cost "
            f"${max_cost_usd:,.2f}; nothing was downloaded"
        )
    return t


# --- fetching -------------------------------------------------------------------------------


def zstd_frames_complete(path: Path, bufsize: int = 1 << 20) -> bool:
    """True when every zstd frame in ``path`` ends (a cut file fails; multi-frame files pass)."""
    dctx = zstandard.ZstdDecompressor()
    d = None
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):
            while chunk:
                d = d or dctx.decompressobj()
                try:
                    d.decompress(chunk)
                except zstandard.ZstdError:
                    return False
                chunk, d = (d.unused_data, None) if d.eof else (b"", d)
    return d is None and path.stat().st_size > 0


@contextlib.contextmanager
def _watch_size(path_of: Callable[[], Path | None], report: Callable[[int], None]) -> Iterator[None]:
    """Report the growing size of a file being written by someone else (the client)."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(0.2):
            p = path_of()
            with contextlib.suppress(OSError):
                if p is not None:
                    report(p.stat().st_size)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def _remove_stale_temporaries(final: Path) -> None:
    """Temporary files of an earlier, killed download of ``final`` (atomic_path's naming)."""
    for p in final.parent.glob(f".{final.name}.tmp-*"):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


@dataclass
class FileResult:
    request: FileRequest
    path: Path
    action: str  # "skipped" | "streamed" | "batch"
    bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def fetch_stream(client: Any, q: Quote, *, key: str | None = None, progress: Progress | None = None) -> int:
    """``timeseries.get_range`` into a temporary file, checked, then renamed. Returns bytes."""
    tr = _Translate(key)
    final = q.path
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(final)
    label = q.request.label
    with tr(f"{label}: download"), atomic_path(final) as tmp:
        watch = _watch_size(lambda: tmp, lambda n: progress(label, n, None)) if progress else None
        with watch or contextlib.nullcontext():
            client.timeseries.get_range(path=tmp, **q.request.params())
        if not zstd_frames_complete(tmp):
            raise DownloadError(f"{label}: the response ended inside a zstd frame (truncated download)")
        size = tmp.stat().st_size
    if progress:
        progress(label, size, size)
    return size


def _batch_state_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.batch.json")


def _batch_stage_dir(final: Path) -> Path:
    return final.with_name(f".{final.name}.batch")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def fetch_batch(
    client: Any,
    q: Quote,
    *,
    key: str | None = None,
    progress: Progress | None = None,
    poll_seconds: float = BATCH_POLL_SECONDS,
    timeout_seconds: float = BATCH_TIMEOUT_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[int, str]:
    """A batch job for one quarter file: submit (or reuse the recorded job), wait until done,
    download the one DBN file with resume, verify, rename. Returns (bytes, job id)."""
    tr = _Translate(key)
    final, req, label = q.path, q.request, q.request.label
    final.parent.mkdir(parents=True, exist_ok=True)
    state_path = _batch_state_path(final)
    params = req.params()
    job_id: str | None = None
    if state_path.is_file():
        state = json.loads(state_path.read_text())
        if state.get("params") == params:
            job_id = state["job_id"]
    if job_id is None:
        with tr(f"{label}: batch submit"):
            job = client.batch.submit_job(
                **params, encoding="dbn", compression="zstd", split_duration="none", delivery="download"
            )
        job_id = str(job["id"])
        atomic_write_text(state_path, json.dumps({"job_id": job_id, "params": params}))
    deadline = time.monotonic() + timeout_seconds
    while True:
        with tr(f"{label}: batch job {job_id}"):
            state_name = str(client.batch.get_job_details(job_id).get("state", ""))
        if state_name == "done":
            break
        if state_name == "expired":
            state_path.unlink(missing_ok=True)
            raise DownloadError(
                f"{label}: batch job {job_id} expired before its file was downloaded; rerun to submit it again"
            )
        if time.monotonic() > deadline:
            raise DownloadError(
                f"{label}: batch job {job_id} not done after {timeout_seconds:.0f} s (state {state_name!r}); "
                "rerun later to resume waiting"
            )
        if progress:
            progress(f"{label} (batch {state_name or 'queued'})", 0, None)
        sleep(poll_seconds)
    with tr(f"{label}: batch job {job_id} files"):
        files = client.batch.list_files(job_id)
    data = [f for f in files if str(f.get("filename", "")).endswith(".dbn.zst")]
    if len(data) != 1:
        raise DownloadError(
            f"{label}: batch job {job_id} has {len(data)} .dbn.zst files, expected one per quarter"
        )
    entry = data[0]
    stage = _batch_stage_dir(final)
    staged = stage / job_id / entry["filename"]
    total_size = int(entry.get("size") or 0)
    with (
        tr(f"{label}: batch download"),
        _watch_size(lambda: staged, lambda n: progress(label, n, total_size or None))
        if progress
        else contextlib.nullcontext(),
    ):
        client.batch.download(job_id, output_dir=stage, filename_to_download=entry["filename"])
    want = str(entry.get("hash", ""))
    if want.startswith("sha256:") and _sha256(staged) != want.removeprefix("sha256:"):
        staged.unlink(missing_ok=True)  # a wrong file must not resume
        raise DownloadError(
            f"{label}: batch file {entry['filename']} fails its SHA-256; rerun to fetch it again"
        )
    if not zstd_frames_complete(staged):
        staged.unlink(missing_ok=True)
        raise DownloadError(f"{label}: batch file {entry['filename']} is truncated; rerun to fetch it again")
    size = staged.stat().st_size
    os.replace(staged, final)  # same folder tree, same file system: atomic
    state_path.unlink(missing_ok=True)
    shutil.rmtree(stage, ignore_errors=True)
    if progress:
        progress(label, size, size)
    return size, job_id


def download(
    client: Any,
    quotes: Sequence[Quote],
    *,
    key: str | None = None,
    progress: Progress | None = None,
    on_file: Callable[[FileResult], None] | None = None,
    poll_seconds: float = BATCH_POLL_SECONDS,
    timeout_seconds: float = BATCH_TIMEOUT_SECONDS,
) -> list[FileResult]:
    """Fetch every quoted file in order; present files are skipped (no request). The first
    failure raises :class:`DownloadError`; files finished before it stay."""
    results: list[FileResult] = []
    for q in quotes:
        if q.present or q.path.is_file():
            res = FileResult(q.request, q.path, "skipped", q.path.stat().st_size)
        elif q.method == "batch":
            n, job_id = fetch_batch(
                client,
                q,
                key=key,
                progress=progress,
                poll_seconds=poll_seconds,
                timeout_seconds=timeout_seconds,
            )
            res = FileResult(q.request, q.path, "batch", n, {"job_id": job_id})
        else:
            res = FileResult(
                q.request, q.path, "streamed", fetch_stream(client, q, key=key, progress=progress)
            )
        results.append(res)
        if on_file:
            on_file(res)
    return results
