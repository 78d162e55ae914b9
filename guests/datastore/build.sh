#!/usr/bin/env bash
# Builds the plugin into a component (its tests first), checks it as the operator will, tests the
# status the operator would write, and prints how to push it: the steps `host new --lang rust`
# writes, shared by the built-in plugins (members of this workspace) in ../guest-build.sh.
exec "$(dirname "$0")/../guest-build.sh" datastore \
  'endpoint: datastore.hanzo.svc.cluster.local:' \
  'readyReplicas: 1'
