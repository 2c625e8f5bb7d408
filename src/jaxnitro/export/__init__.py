"""Export: the wire contract, the export sequence, the StableHLO bundle, provenance,
and loading a bundle back (`export_model`, `StableHLOBundle`, `load_bundle`)."""

from .backend import ExportBackend as ExportBackend
from .backend import ExportRequest as ExportRequest
from .bundle import StableHLOBundle as StableHLOBundle
from .format import BundleChecksumError as BundleChecksumError
from .format import BundleError as BundleError
from .format import BundleFileMissingError as BundleFileMissingError
from .format import BundleManifestError as BundleManifestError
from .format import BundlePathError as BundlePathError
from .format import BundlePlatformError as BundlePlatformError
from .format import BundleProgramError as BundleProgramError
from .format import BundleVersionError as BundleVersionError
from .loader import LoadedBundle as LoadedBundle
from .loader import load_bundle as load_bundle
from .provenance import export_provenance as export_provenance
from .provenance import git_provenance as git_provenance
from .provenance import site_provenance as site_provenance
from .sequence import export_model as export_model
from .spec import ExportSpec as ExportSpec
from .tf_saved_model import TFSavedModel as TFSavedModel
from .view import export_view as export_view

__all__ = [
    "BundleChecksumError",
    "BundleError",
    "BundleFileMissingError",
    "BundleManifestError",
    "BundlePathError",
    "BundlePlatformError",
    "BundleProgramError",
    "BundleVersionError",
    "ExportBackend",
    "ExportRequest",
    "ExportSpec",
    "LoadedBundle",
    "StableHLOBundle",
    "TFSavedModel",
    "export_model",
    "export_provenance",
    "export_view",
    "git_provenance",
    "load_bundle",
    "site_provenance",
]
