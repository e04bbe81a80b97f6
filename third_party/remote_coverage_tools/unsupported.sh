#!/bin/sh
# What @remote_coverage_tools' targets run: coverage needs Bazel's downloaded tools.
echo "coverage is not available in the offline build" >&2
exit 1
