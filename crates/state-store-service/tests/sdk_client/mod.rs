//! One session of the official SDK with a state store client, its session task
//! running: what the SDK tests start from their own connection settings and stop.

use std::sync::Arc;
use std::time::Duration;

use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettings;
use azure_iot_operations_mqtt::session::{Session, SessionExitHandle, SessionOptionsBuilder};
use azure_iot_operations_protocol::application::ApplicationContextBuilder;
use azure_iot_operations_services::state_store;
use tokio::task::JoinHandle;
use tokio::time::timeout;

pub struct Sdk {
    pub store: Arc<state_store::Client>,
    exit: SessionExitHandle,
    run: JoinHandle<()>,
}

impl Sdk {
    /// A session connecting with `settings`, and a state store client on it.
    pub fn start(settings: MqttConnectionSettings) -> Sdk {
        let options = SessionOptionsBuilder::default()
            .connection_settings(settings)
            .build()
            .unwrap();
        let session = Session::new(options).unwrap();
        let store = state_store::Client::new(
            ApplicationContextBuilder::default().build().unwrap(),
            session.create_managed_client(),
            session.create_session_monitor(),
            state_store::ClientOptionsBuilder::default()
                .build()
                .unwrap(),
        )
        .unwrap();
        let exit = session.create_exit_handle();
        let run = tokio::spawn(async move {
            session.run().await.unwrap();
        });
        Sdk {
            store: Arc::new(store),
            exit,
            run,
        }
    }

    /// Shuts the client down and ends the session, within `limit`.
    pub async fn close(self, limit: Duration) {
        self.store.shutdown().await.unwrap();
        self.exit.try_exit().unwrap();
        timeout(limit, self.run).await.unwrap().unwrap();
    }
}
