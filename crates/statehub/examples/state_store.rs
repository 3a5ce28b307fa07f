//! The official Azure IoT Operations Rust SDK's state store client against statehub,
//! unchanged: set a key, read it back, delete it.
//!
//!     cargo run -p statehub --example state_store -- [HOST] [PORT]
#![allow(clippy::print_stdout)] // an example: what it prints is the point

use std::time::Duration;

use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettingsBuilder;
use azure_iot_operations_mqtt::session::{Session, SessionOptionsBuilder};
use azure_iot_operations_protocol::application::ApplicationContextBuilder;
use azure_iot_operations_services::state_store::{self, SetOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let host = args.next().unwrap_or_else(|| "localhost".to_owned());
    let port: u16 = args.next().map_or(Ok(1883), |p| p.parse())?;
    let timeout = Duration::from_secs(10);

    let settings = MqttConnectionSettingsBuilder::default()
        .client_id("state-store-example")
        .hostname(host)
        .tcp_port(port)
        .use_tls(false)
        .build()?;
    let options = SessionOptionsBuilder::default()
        .connection_settings(settings)
        .build()?;
    let session = Session::new(options)?;
    let store = state_store::Client::new(
        ApplicationContextBuilder::default().build()?,
        session.create_managed_client(),
        session.create_session_monitor(),
        state_store::ClientOptionsBuilder::default().build()?,
    )?;
    let exit = session.create_exit_handle();
    let session = tokio::spawn(session.run());

    let (key, value) = (b"sdk-example".to_vec(), b"hello from the SDK".to_vec());
    let set = store
        .set(key.clone(), value, timeout, None, SetOptions::default())
        .await?;
    println!("set: {}", set.response);
    let get = store.get(key.clone(), timeout).await?;
    println!(
        "get: {}",
        String::from_utf8_lossy(&get.response.unwrap_or_default())
    );
    let del = store.del(key, None, timeout).await?;
    println!("del: {}", del.response);

    store.shutdown().await?;
    exit.try_exit()?;
    session.await??;
    Ok(())
}
