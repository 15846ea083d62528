//! Where a fleet lives in Azure Resource Manager's terms (API.md, "Fleet Manager (ARM) paths"):
//! its subscription and resource group, recorded in its stored body, and the server's settings
//! for fleets created on `/v1` or without a driver. What the ARM layer (`arm`), the handlers and
//! the shared state all read.

use serde_json::{Value, json};

/// Where fleets live in Azure's terms, and what a fleet created without a driver gets.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The subscription of fleets created on `/v1` (`--arm-subscription`).
    pub subscription: String,
    /// The resource group of fleets created on `/v1` (`--arm-resource-group`).
    pub resource_group: String,
    /// The driver of a fleet created without one (`--default-driver`).
    pub default_driver: Option<Value>,
    /// Whether the server answers over TLS: the scheme of absolute links.
    pub https: bool,
    /// Where users reach the server (`--public-url`): the start of absolute links.
    pub public_url: Option<String>,
    /// Whether the server listens on a loopback address only (no one reaches it over a
    /// network): with neither TLS nor a public URL, its cookies may then go without `Secure`.
    pub loopback_listener: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            subscription: "00000000-0000-0000-0000-000000000000".into(),
            resource_group: "flotilla".into(),
            default_driver: None,
            https: false,
            public_url: None,
            loopback_listener: false,
        }
    }
}

/// The key of a fleet's stored body that records its subscription and resource group; the API
/// never shows it (it is the key of internal fields, removed from every answer).
pub const HOME: &str = crate::runs::SNAPSHOT;

/// A fleet's subscription and resource group.
#[derive(Clone, Debug, PartialEq)]
pub struct Home {
    pub subscription: String,
    pub resource_group: String,
}

impl Home {
    /// The home a fleet's stored body records, or the server's for a fleet created on `/v1`.
    pub fn of(fleet_body: &Value, settings: &Settings) -> Home {
        let recorded = &fleet_body[HOME];
        match (
            recorded["subscription"].as_str(),
            recorded["resourceGroup"].as_str(),
        ) {
            (Some(s), Some(g)) => Home {
                subscription: s.into(),
                resource_group: g.into(),
            },
            _ => Home {
                subscription: settings.subscription.clone(),
                resource_group: settings.resource_group.clone(),
            },
        }
    }

    pub fn to_json(&self) -> Value {
        json!({"subscription": self.subscription, "resourceGroup": self.resource_group})
    }

    /// The ARM id of a fleet of this home.
    pub fn fleet_id(&self, fleet: &str) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.ContainerService/fleets/{fleet}",
            self.subscription, self.resource_group
        )
    }

    /// Whether this is the home a request names (its resource group, when it names one).
    pub fn is(&self, subscription: &str, resource_group: Option<&str>) -> bool {
        self.subscription.eq_ignore_ascii_case(subscription)
            && resource_group.is_none_or(|g| self.resource_group.eq_ignore_ascii_case(g))
    }
}

/// An ARM request, as its handler sees it (a request extension): the home it was sent under.
#[derive(Clone, Debug)]
pub struct Arm {
    pub home: Home,
}
