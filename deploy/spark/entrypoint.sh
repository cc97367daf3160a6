#!/bin/bash
# The entrypoint of nsqworker's Spark job image (deploy/spark/Dockerfile). pyspark's pip
# package ships no kubernetes/dockerfiles/spark/entrypoint.sh, so this is the part of it
# that Spark's Kubernetes backend relies on:
#   executor   what Spark puts in executor pods: KubernetesExecutorBackend, from the
#              SPARK_* environment the driver sets on the pod;
#   driver     what Spark puts in the driver pod in cluster mode: spark-submit in client
#              mode inside the pod, bound to the pod's address;
#   anything else is exec'd as given (spark-submit ..., python3 ..., bash).
# Everything is exec'd: the JVM (or the command) is PID 1 and gets Kubernetes' SIGTERM.
set -eo pipefail

SPARK_CLASSPATH="${SPARK_CLASSPATH:+$SPARK_CLASSPATH:}${SPARK_HOME}/jars/*"
# Spark mounts its configuration (log4j2 settings among it) at SPARK_CONF_DIR in pods.
if [[ -n "${SPARK_CONF_DIR:-}" ]]; then
  SPARK_CLASSPATH="$SPARK_CONF_DIR:$SPARK_CLASSPATH"
fi
# The executor's JVM options, in the order the driver numbered them (SPARK_JAVA_OPT_0, _1...).
mapfile -t SPARK_EXECUTOR_JAVA_OPTS < <(env | grep SPARK_JAVA_OPT_ | sort -t_ -k4 -n | sed 's/[^=]*=\(.*\)/\1/g')

case "${1:-}" in
  executor)
    shift
    exec "$JAVA_HOME/bin/java" "${SPARK_EXECUTOR_JAVA_OPTS[@]}" \
      -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
      -cp "$SPARK_CLASSPATH" org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" \
      --cores "$SPARK_EXECUTOR_CORES" --app-id "$SPARK_APPLICATION_ID" \
      --hostname "$SPARK_EXECUTOR_POD_IP" --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
      --podName "$SPARK_EXECUTOR_POD_NAME"
    ;;
  driver)
    shift
    exec "$SPARK_HOME/bin/spark-submit" --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=$SPARK_DRIVER_BIND_ADDRESS" \
      --deploy-mode client "$@"
    ;;
  *) exec "$@" ;;
esac
