"""The exceptions the package raises, one per way a command ends (the CLI's exit status)."""


class RhosynthError(Exception):
    """Anything the engine refused or could not do; the message is the CLI's."""


class SpecError(RhosynthError):
    """The spec, the data or an argument was refused before the job started: nothing was
    read for a release and nothing was charged."""


class LedgerRefused(RhosynthError):
    """The privacy ledger refused the charge (the CLI's exit status 3): the dataset's
    budget does not cover it. Nothing was read, charged or written."""


class JobFailed(RhosynthError):
    """The job started and failed. Nothing was released; a charge the ledger had already
    recorded stays there (the ledger shows it)."""

    def __init__(self, message, job_id=None):
        super().__init__(message)
        self.job_id = job_id
