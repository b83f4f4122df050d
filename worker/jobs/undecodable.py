"""Job messages a worker cannot decode: which job they belong to, and ending that job ``failed``
(``undecodable_job``) instead of leaving it queued for the reaper to re-send forever."""

from __future__ import annotations

import logging
import re

from pydantic import ValidationError

from inferq.shared import keys
from inferq.shared.errors import InvalidRequest
from inferq.shared.redis import retried
from inferq.shared.schemas import ErrorInfo
from inferq.shared.store import JobStore

log = logging.getLogger(__name__)

_PAYLOAD_ID = re.compile(r'"id"\s*:\s*"(' + keys.JOB_ID_PATTERN + r')"')


def undecodable_job_id(task_id: str | None, payload: object) -> str | None:
    """The job a payload that failed to decode belongs to, without decoding it: the task id (the
    gateway and the reaper send each job with ``task_id = job id``), else the first ``"id"`` of
    the job's form in the raw text. None when neither names a job."""
    if task_id and keys.is_job_id(task_id):
        return task_id
    if isinstance(payload, (str, bytes)):
        text = payload if isinstance(payload, str) else payload.decode("utf-8", "replace")
        if m := _PAYLOAD_ID.search(text[:4096]):
            return m.group(1)
    return None



async def fail_undecodable(store: JobStore, job_id: str, error: Exception) -> bool:
    """Fail the job of a payload the worker cannot decode, if it is still queued (a running or
    finished job is left as it is), with its final ``error`` event, so that polls see why and
    streams end. Without this the job would stay queued forever and the reaper would re-send
    the same message again and again."""
    if isinstance(error, ValidationError):  # its text would quote the payload: loc and msg only
        detail = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" if x["loc"] else x["msg"]
                           for x in error.errors(include_url=False, include_input=False)[:3])
    else:
        detail = f"{type(error).__name__}: {error}"
    reason = InvalidRequest(f"the worker could not decode the job's message ({detail[:300]})",
                            code="undecodable_job")
    try:
        failed = await retried(lambda: store.fail_queued(job_id, ErrorInfo.of(reason)))
    except Exception as e:  # Redis away: the job stays queued, the reaper re-sends it, we try again
        log.error("job %s: undecodable message, and could not fail the job: %s", job_id, e)
        return False
    log.error("job %s: undecodable message (%s); %s", job_id, reason.message,
              "the job failed" if failed else "the job was no longer queued: left as it is")
    return failed
