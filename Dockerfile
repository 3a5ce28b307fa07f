# statehub in a container: docker build -t statehub . && docker compose up
# (README, "Container"). The build stage compiles exactly what the tests use
# (crates/statehub/tests/container.rs checks the command), with Cargo.lock as is.

FROM rust:1.95-slim-trixie AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY crates ./crates
RUN cargo build --release --locked -p statehub

FROM debian:trixie-slim
# A fixed uid, so a host directory can be given to it; /data is its data dir.
RUN useradd --system --uid 10001 --user-group --home-dir /data --create-home statehub
COPY --from=build /src/target/release/statehub /usr/local/bin/statehub
USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
ENV STATEHUB_DATA_DIR=/data \
    STATEHUB_MQTT_LISTEN=0.0.0.0:1883 \
    STATEHUB_HTTP_LISTEN=0.0.0.0:8080 \
    NO_COLOR=1
# 1883 MQTT, 8883 MQTT over TLS (when configured), 8080 HTTP: Web PubSub, /healthz.
EXPOSE 1883 8883 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["statehub", "healthcheck", "--url", "http://127.0.0.1:8080/healthz"]
ENTRYPOINT ["statehub"]
CMD ["serve"]
