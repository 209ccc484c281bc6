"""Read the job files users already have (launch scripts, logs, engine configs) into an ImportedJob.

``read_job_file(path)`` tells the format from the content (imported.FORMATS) and returns what the file
states, each value with its ``file:line``; ``merge.option_values`` turns that into the values of
``paraplan plan`` / ``evaluate``'s options, which the command line overrides.
"""

from paraplan.job_files.detect import detect_format, read_job_file
from paraplan.job_files.imported import FORMATS, ImportedJob

__all__ = ["FORMATS", "ImportedJob", "detect_format", "read_job_file"]
