"""The ``download_raw`` job: Databento files into the raw layout from Dagster (the same path as
``fx-assets download``, :mod:`fx_assets.core.download`).

The API key reaches the client only through the ``databento`` resource, whose ``api_key`` is
``dg.EnvVar("DATABENTO_API_KEY")``: it is resolved in the run's process and never appears in run
config, logs, metadata or error messages (errors are scrubbed in the core module). Dagster has no
confirmation prompt, so the op refuses to spend more than its required ``max_cost_usd``. The
``observe_raw`` job (or the raw-data sensor) then sees the new files like any others.
"""

from typing import Any

import dagster as dg
from pydantic import Field

from fx_assets.core import download as dl
from fx_assets.core.calendar import quarter_range
from fx_assets.resources.storage import FxStorage


class DatabentoResource(dg.ConfigurableResource):
    """Databento's historical client. Set ``api_key`` with ``dg.EnvVar``, never a literal."""

    api_key: str = Field(description="Databento API key; bind to dg.EnvVar('DATABENTO_API_KEY').")
    gateway: str | None = Field(None, description="Historical gateway URL; None = Databento's default.")

    def client(self) -> Any:
        return dl.make_client(self.api_key, self.gateway)


class DownloadConfig(dg.Config):
    """What to fetch and the most it may cost."""

    dataset: str = Field("GLBX.MDP3", description="Databento dataset code.")
    symbols: list[str] = Field(["ES.FUT"], description="Parent symbols (stype_in=parent).")
    schemas: list[str] = Field(["trades", "mbp-10"], description="Schemas: trades and/or mbp-10.")
    quarters: str = Field(description="Quarter or inclusive range, e.g. 2024-Q1:2024-Q4.")
    max_cost_usd: float = Field(
        ge=0.0, allow_inf_nan=False, description="Refuse when the estimated total is above this (USD)."
    )
    batch_above_gb: float = Field(
        5.0,
        gt=0.0,
        allow_inf_nan=False,
        description="Batch job for files whose billable (uncompressed) size exceeds this (GB).",
    )


@dg.op(
    out=dg.Out(dg.Nothing),
    description="Quote, check the budget, then download Databento files into raw/ (atomic, resumable).",
)
def download_raw_files(
    context: dg.OpExecutionContext, config: DownloadConfig, databento: DatabentoResource, storage: FxStorage
) -> None:
    key = databento.api_key
    try:
        requests = dl.plan(config.dataset, config.symbols, config.schemas, quarter_range(config.quarters))
        client = databento.client()
        quotes = dl.quote(
            client,
            requests,
            storage.layout,
            key=key,
            batch_threshold_bytes=int(config.batch_above_gb * 1e9),
        )
        for q in quotes:
            if q.present:
                context.log.info(f"{q.request.label}: present, skipped")
            else:
                context.log.info(
                    f"{q.request.label}: {q.record_count:,} records, {q.billable_bytes / 1e9:,.3f} GB billable, "
                    f"${q.cost_usd:,.2f} ({q.method})"
                )
        t = dl.check_budget(quotes, config.max_cost_usd)
        context.log.info(f"total: {t.to_fetch} file(s), ${t.cost_usd:,.2f}, {t.billable_bytes / 1e9:,.3f} GB")
        results = dl.download(client, quotes, key=key)
    except (dl.DownloadError, ValueError) as exc:
        raise dg.Failure(description=dl.scrub(str(exc), key)) from None
    context.add_output_metadata(
        {
            "files": dg.MetadataValue.json(
                [
                    {**q.to_dict(), "action": r.action, "bytes": r.bytes}
                    for q, r in zip(quotes, results, strict=True)
                ]
            ),
            "cost_usd": t.cost_usd,
            "billable_bytes": t.billable_bytes,
            "fetched": sum(r.action != "skipped" for r in results),
        }
    )


@dg.job(description="Databento -> raw/{schema}/SYMBOL/SYMBOL_YYYY-Qn.dbn.zst (then run observe_raw).")
def download_raw() -> None:
    download_raw_files()


def download_definitions() -> dg.Definitions:
    """The job and its key-holding resource, to merge into the code location."""
    return dg.Definitions(
        jobs=[download_raw],
        resources={"databento": DatabentoResource(api_key=dg.EnvVar(dl.API_KEY_ENV), gateway=None)},
    )
