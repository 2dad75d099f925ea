"""Reconstructable jobs for tests that run through the multiprocess executor (settings from FX_*)."""

import dagster as dg

from fx_assets.definitions import build_definitions
from fx_assets.settings import load_settings


def build_features_job() -> dg.JobDefinition:
    return build_definitions(load_settings()).resolve_job_def("build_features")
